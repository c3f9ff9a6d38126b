"""``spec.recovery``: the recovery ladder (DESIGN section 4) and its limits.

HyperPod's names are accepted where they mean the same: ``jobMaxRetryCount``,
``numRestartBeforeFullJobRestart``, ``evalPeriodSeconds``, ``maxFullJobRestarts`` and
``faultyScaleDownTimeoutInSeconds``; so is HyperPod's ``restartPolicy`` block holding
the middle three, pasted as it is into ``recovery``.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field, NonNegativeInt, field_validator, model_validator

from resurge.contract.vocabulary import RecoveryLevel
from resurge.jobspec._base import SpecModel

__all__ = ["TOP_RUNG_LIMIT", "BackoffSpec", "RecoverySpec"]

# Restarts the top rung of a job's ladder may take within evalPeriodSeconds, unless
# maxRestartsPerLevel says otherwise: what ends a crash loop once it has climbed the ladder.
TOP_RUNG_LIMIT = 3


def _every_level() -> list[RecoveryLevel]:
    return list(RecoveryLevel)


class BackoffSpec(SpecModel):
    """Delay before the n-th restart for one fault that the restarts before did not fix
    (a crash loop): none for the first, then ``min(initialSeconds * multiplier**(n-2),
    maxSeconds)``. Independent faults are restarted at once."""

    initial_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Delay before the second restart for a fault the first did not fix "
        "(the first goes at once).",
        examples=[1.0],
    )
    max_seconds: float = Field(
        default=60.0, ge=0, description="The delay never grows past this.", examples=[60.0]
    )
    multiplier: float = Field(
        default=2.0, ge=1, description="Each further restart waits this many times longer."
    )

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> BackoffSpec:
        if self.max_seconds < self.initial_seconds:
            raise ValueError(
                f"backoff.maxSeconds ({self.max_seconds}) is below "
                f"backoff.initialSeconds ({self.initial_seconds})"
            )
        return self


_RESTART_POLICY_FIELDS = (
    "numRestartBeforeFullJobRestart",
    "evalPeriodSeconds",
    "maxFullJobRestarts",
)


class RecoverySpec(SpecModel):
    """The recovery ladder this job may use and the limits that end crash loops."""

    levels: list[RecoveryLevel] = Field(
        default_factory=_every_level,
        min_length=1,
        description="Rungs of the ladder this job may use, cheapest first; a subset of "
        "in_process, process, pod, node, job in that order. Default: all five.",
        examples=[["process", "node", "job"]],
    )
    max_restarts: int | None = Field(
        default=None,
        ge=0,
        alias="jobMaxRetryCount",
        description="Restarts at any level over the job's whole life before it fails "
        "(HyperPod: jobMaxRetryCount). Unset: no lifetime cap; crash loops are bounded by "
        "the per-window limits (maxRestartsPerLevel).",
    )
    max_restarts_per_level: dict[RecoveryLevel, NonNegativeInt] = Field(
        default_factory=dict,
        description="Restarts allowed at one level within evalPeriodSeconds before the next "
        "level up is used; at the top rung of `levels`, before the job fails. A level left "
        f"out has no limit of its own, except the top rung: {TOP_RUNG_LIMIT} unless set.",
        examples=[{"process": 3, "node": 2}],
    )
    num_restart_before_full_job_restart: int | None = Field(
        default=None,
        ge=0,
        description="Restarts below the `job` level within evalPeriodSeconds before a full "
        "job restart (HyperPod: restartPolicy.numRestartBeforeFullJobRestart).",
    )
    max_full_job_restarts: int | None = Field(
        default=None,
        ge=0,
        description="Full job restarts (the `job` level) before the job fails "
        "(HyperPod: restartPolicy.maxFullJobRestarts).",
    )
    eval_period_seconds: float = Field(
        default=600.0,
        gt=0,
        description="Window in which restarts are counted against the per-level limits and "
        "a repeating fault escalates (HyperPod: restartPolicy.evalPeriodSeconds).",
    )
    backoff: BackoffSpec = Field(
        default_factory=BackoffSpec, description="Delay before each restart."
    )
    max_repeat_offenders: int = Field(
        default=2,
        ge=1,
        description="Node faults one node may have under this job within evalPeriodSeconds "
        "before the job avoids it and handles any fault there at node level.",
    )
    spares: int = Field(
        default=0,
        ge=0,
        description="Spare nodes held for this job, so a `node` recovery need not wait for "
        "capacity (HyperPod: replicaSpecs[].spares).",
    )
    faulty_scale_down_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        alias="faultyScaleDownTimeoutSeconds",
        validation_alias=AliasChoices(
            "faultyScaleDownTimeoutSeconds",
            "faultyScaleDownTimeoutInSeconds",
        ),
        description="How long an elastic job (min < max) waits for a replacement after a "
        "node is lost before it shrinks instead "
        "(HyperPod: elasticPolicy.faultyScaleDownTimeoutInSeconds).",
    )
    in_process_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        alias="inProcessTimeoutSeconds",
        description="For an `in_process` restart: how long each worker has to leave the "
        "failed generation before its agent restarts the processes instead.",
    )
    stop_grace_seconds: float = Field(
        default=10.0,
        gt=0,
        alias="stopGraceSeconds",
        description="Seconds between SIGTERM and SIGKILL when workers are stopped.",
    )

    @model_validator(mode="before")
    @classmethod
    def _hyperpod_restart_policy(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "restartPolicy" not in data:
            return data
        block = data["restartPolicy"]
        allowed = _RESTART_POLICY_FIELDS
        if not isinstance(block, dict) or not set(block) <= set(allowed):
            raise ValueError(
                f"restartPolicy (HyperPod's) may hold only {', '.join(allowed)}; got {block!r}"
            )
        both = sorted(set(block) & set(data))
        if both:
            raise ValueError(f"{', '.join(both)} set both in recovery and in restartPolicy")
        return {**{k: v for k, v in data.items() if k != "restartPolicy"}, **block}

    @field_validator("levels")
    @classmethod
    def _ladder_order(cls, levels: list[RecoveryLevel]) -> list[RecoveryLevel]:
        ladder = list(RecoveryLevel)
        if len(set(levels)) != len(levels) or levels != sorted(levels, key=ladder.index):
            order = ", ".join(level.value for level in ladder)
            raise ValueError(f"levels must be listed once each, in ladder order: {order}")
        return levels

    @model_validator(mode="after")
    def _limits_for_used_levels(self) -> RecoverySpec:
        unused = [level.value for level in self.max_restarts_per_level if level not in self.levels]
        if unused:
            raise ValueError(
                f"maxRestartsPerLevel sets a limit for {', '.join(unused)}, "
                "which is not in recovery.levels"
            )
        return self
