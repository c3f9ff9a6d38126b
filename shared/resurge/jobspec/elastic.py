"""``spec.elastic``: how the scaler paces and bounds the resizes of an elastic job.

An elastic job is one whose ``replicas.min`` is below its ``replicas.max``
(:attr:`~resurge.jobspec.ReplicaSpec.elastic`). HyperPod's names are accepted where they
mean the same: ``scaleUpSnoozeTimeInSeconds`` and ``gracefulShutdownTimeoutInSeconds``.
So is HyperPod's ``elasticPolicy`` block, pasted as it is onto ``spec``:
:func:`fold_elastic_policy` spreads it over ``replicas``, ``elastic`` and ``recovery``
before the spec is validated, and rejects a value set both ways unless the two agree.
Its ``scalingTimeoutInSeconds`` means something resurge has no setting for
(:data:`NOT_TAKEN_FROM_ELASTIC_POLICY`) and is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    PositiveInt,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from resurge.jobspec._base import SpecModel
from resurge.jobspec.recovery import RecoverySpec
from resurge.jobspec.replicas import ReplicaSpec

__all__ = [
    "ELASTIC_POLICY_FIELDS",
    "NOT_TAKEN_FROM_ELASTIC_POLICY",
    "ElasticSpec",
    "fold_elastic_policy",
]


class ElasticSpec(SpecModel):
    """How the scaler paces and bounds the resizes of an elastic job.

    An elastic job is one whose ``replicas`` allow more than one size; a fixed-size job
    is never resized, so none of this applies to it.
    """

    cooldown_seconds: float = Field(
        default=60.0,
        ge=0,
        description="After a resize of this job, no other resize of it for this many seconds.",
        examples=[60.0],
    )
    scale_up_snooze_seconds: float = Field(
        default=60.0,
        ge=0,
        alias="scaleUpSnoozeSeconds",
        validation_alias=AliasChoices("scaleUpSnoozeSeconds", "scaleUpSnoozeTimeInSeconds"),
        description="After a restart (any recovery) of this job, it is not grown for this "
        "many seconds; shrinking is not held back (HyperPod: scaleUpSnoozeTimeInSeconds).",
        examples=[60.0],
    )
    checkpoint_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        alias="checkpointTimeoutSeconds",
        validation_alias=AliasChoices(
            "checkpointTimeoutSeconds", "gracefulShutdownTimeoutInSeconds"
        ),
        description="How long a resize waits for the checkpoint it asked the workers for "
        "before it resumes from the newest complete checkpoint instead "
        "(HyperPod: elasticPolicy.gracefulShutdownTimeoutInSeconds).",
        examples=[30.0],
    )
    scaling_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        alias="scalingTimeoutSeconds",
        description="How long the replicas a grow adds may take to come up (their agents "
        "waiting for work, warmed up) before the grow is dropped and its new worker groups "
        "deleted; the job trains on at its size meanwhile. Not HyperPod's "
        "elasticPolicy.scalingTimeoutInSeconds, which is a wait before a scale-up starts.",
        examples=[300.0],
    )

    @model_validator(mode="before")
    @classmethod
    def _no_hyperpod_name_of_another_meaning(cls, data: Any) -> Any:
        for key in data if isinstance(data, Mapping) else ():
            if key in NOT_TAKEN_FROM_ELASTIC_POLICY:
                raise ValueError(f"{key}: {NOT_TAKEN_FROM_ELASTIC_POLICY[key]}: remove it")
        return data


class _ElasticPolicy(SpecModel):
    """HyperPod's ``elasticPolicy`` block, checked in HyperPod's names before it is folded."""

    min_replicas: int | None = Field(default=None, ge=1, description="replicas.min")
    max_replicas: int | None = Field(default=None, ge=1, description="replicas.max")
    replica_increment_step: int | None = Field(default=None, ge=1, description="replicas.step")
    replica_discrete_values: list[PositiveInt] | None = Field(
        default=None, min_length=1, description="replicas.discrete"
    )
    graceful_shutdown_timeout_in_seconds: float | None = Field(
        default=None, gt=0, description="elastic.checkpointTimeoutSeconds"
    )
    faulty_scale_down_timeout_in_seconds: float | None = Field(
        default=None, gt=0, description="recovery.faultyScaleDownTimeoutSeconds"
    )

    @field_validator("replica_discrete_values")
    @classmethod
    def _listed_once(cls, sizes: list[int] | None) -> list[int] | None:
        if sizes is None:
            return None
        repeated = sorted({size for size in sizes if sizes.count(size) > 1})
        if repeated:
            raise ValueError(f"lists {repeated} more than once")
        return sizes

    @model_validator(mode="after")
    def _consistent(self) -> _ElasticPolicy:
        low, high = self.min_replicas, self.max_replicas
        if low is not None and high is not None and high < low:
            raise ValueError(
                f"elasticPolicy.maxReplicas ({high}) is below elasticPolicy.minReplicas ({low})"
            )
        if self.replica_increment_step is not None and self.replica_discrete_values is not None:
            raise ValueError(
                "elasticPolicy.replicaIncrementStep and elasticPolicy.replicaDiscreteValues "
                "exclude each other: set one"
            )
        outside = [
            size
            for size in self.replica_discrete_values or []
            if (low is not None and size < low) or (high is not None and size > high)
        ]
        if outside:
            raise ValueError(
                f"elasticPolicy.replicaDiscreteValues sizes {outside} are outside "
                f"[minReplicas={low}, maxReplicas={high}]"
            )
        return self


# Each elasticPolicy key: the spec section it lands in, and the field there.
_TARGETS: dict[str, tuple[str, type[SpecModel], str]] = {
    "minReplicas": ("replicas", ReplicaSpec, "min"),
    "maxReplicas": ("replicas", ReplicaSpec, "max"),
    "replicaIncrementStep": ("replicas", ReplicaSpec, "step"),
    "replicaDiscreteValues": ("replicas", ReplicaSpec, "discrete"),
    "gracefulShutdownTimeoutInSeconds": ("elastic", ElasticSpec, "checkpoint_timeout_seconds"),
    "faultyScaleDownTimeoutInSeconds": (
        "recovery",
        RecoverySpec,
        "faulty_scale_down_timeout_seconds",
    ),
}

ELASTIC_POLICY_FIELDS = tuple(_TARGETS)
"""The keys of HyperPod's ``elasticPolicy`` that ``spec.elasticPolicy`` accepts."""

NOT_TAKEN_FROM_ELASTIC_POLICY = {
    "scalingTimeoutInSeconds": "HyperPod waits this long, once a scaling event is "
    "detected, before it starts a scale-up; resurge has no such setting (its "
    "elastic.cooldownSeconds holds every resize back for a time after the last one, and "
    "elastic.scalingTimeoutSeconds is how long a grow's new replicas may take to come up, "
    "another thing)",
}
"""Keys of HyperPod's ``elasticPolicy`` with no resurge setting of the same meaning: why."""


def _spellings(model: type[SpecModel], name: str) -> list[str]:
    """Every key that sets field ``name`` of ``model``, its wire name first."""
    field = model.model_fields[name]
    spellings = [field.alias or name]
    if isinstance(field.validation_alias, AliasChoices):
        spellings += [str(choice) for choice in field.validation_alias.choices]
    spellings.append(name)
    return list(dict.fromkeys(spellings))


def _comparable(model: type[SpecModel], name: str, value: Any) -> Any:
    """``value`` as the field would hold it, so ``"4"`` and ``4`` agree; as given if invalid."""
    annotation: Any = model.model_fields[name].annotation
    try:
        value = TypeAdapter(annotation).validate_python(value)
    except ValidationError:
        return value
    return sorted(value) if isinstance(value, list) else value


def _checked_policy(block: Any) -> dict[str, Any]:
    """The block's values in HyperPod's names, or ValueError naming the bad key."""
    allowed = ", ".join(ELASTIC_POLICY_FIELDS)
    if not isinstance(block, Mapping):
        raise ValueError(f"elasticPolicy (HyperPod's) must be a mapping of {allowed}")
    for key in block:
        if key in NOT_TAKEN_FROM_ELASTIC_POLICY:
            raise ValueError(
                f"elasticPolicy.{key}: {NOT_TAKEN_FROM_ELASTIC_POLICY[key]}: remove it "
                "(resurge convert drops it with a warning)"
            )
    unknown = [str(key) for key in block if key not in _TARGETS]
    if unknown:
        raise ValueError(
            f"elasticPolicy.{', elasticPolicy.'.join(unknown)}: not among the elasticPolicy "
            f"fields resurge takes from HyperPod: {allowed}"
        )
    try:
        policy = _ElasticPolicy.model_validate(dict(block))
    except ValidationError as error:
        problems = []
        for item in error.errors():
            message = item["msg"].removeprefix("Value error, ")
            where = ".".join(str(part) for part in item["loc"])
            problems.append(f"elasticPolicy.{where}: {message}" if where else message)
        raise ValueError("; ".join(problems)) from None
    return policy.model_dump(by_alias=True, exclude_unset=True)


def _as_mapping(section: Any) -> Any:
    if isinstance(section, BaseModel):
        return section.model_dump(by_alias=True, exclude_unset=True)
    return section


def fold_elastic_policy(data: Any) -> Any:
    """Spread a ``spec`` mapping's ``elasticPolicy`` block over its other sections.

    ``minReplicas``, ``maxReplicas``, ``replicaIncrementStep`` and
    ``replicaDiscreteValues`` become ``replicas.min``, ``max``, ``step`` and ``discrete``;
    ``gracefulShutdownTimeoutInSeconds`` becomes ``elastic.checkpointTimeoutSeconds``;
    ``faultyScaleDownTimeoutInSeconds`` becomes ``recovery.faultyScaleDownTimeoutSeconds``.
    A value given both ways must agree. Anything but a mapping with that key is returned
    as it is.

    Raises:
        ValueError: the block is not a mapping, holds a key not listed above (such as
            ``scalingTimeoutInSeconds``) or an invalid
            value, or disagrees with the section it folds into; the message names the field.
    """
    if not isinstance(data, Mapping) or "elasticPolicy" not in data:
        return data
    block = data["elasticPolicy"]
    folded = {key: value for key, value in data.items() if key != "elasticPolicy"}
    for key, value in _checked_policy(block).items():
        section_name, model, name = _TARGETS[key]
        section = _as_mapping(folded.get(section_name, {}))
        if not isinstance(section, Mapping):
            continue  # not a mapping: validating the section itself names the problem
        given = [spelling for spelling in _spellings(model, name) if spelling in section]
        for spelling in given:
            if _comparable(model, name, section[spelling]) != _comparable(model, name, value):
                raise ValueError(
                    f"elasticPolicy.{key} ({block[key]!r}) and {section_name}.{spelling} "
                    f"({section[spelling]!r}) set the same thing differently: set one"
                )
        if not given:
            folded[section_name] = {**section, _spellings(model, name)[0]: value}
    return folded
