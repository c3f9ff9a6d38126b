"""``spec.replicas``: how many replicas the job runs with, and which sizes are allowed."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, PositiveInt, field_validator, model_validator

from resurge.jobspec._base import SpecModel
from resurge.jobspec.mutability import immutable_fields

__all__ = ["ReplicaSpec"]

# The rules across fields that an edit of the one mutable field (``max``) could break, as
# CEL in the CRD: the API server refuses such an edit instead of resurge failing the job.
_CONSISTENT = (
    {
        "rule": "!has(self.max) || self.max >= (has(self.min) ? self.min : 1)",
        "message": "spec.replicas.max must be at least spec.replicas.min",
    },
    {
        "rule": "!has(self.max) || !has(self.discrete) || self.discrete.all(s, s <= self.max)",
        "message": "spec.replicas.discrete sizes must be at most spec.replicas.max",
    },
)


def _schema_extra(schema: dict[str, Any]) -> None:
    immutable_fields("spec.replicas")(schema)
    schema.setdefault("x-kubernetes-validations", []).extend(dict(r) for r in _CONSISTENT)


class ReplicaSpec(SpecModel):
    """Replica counts, like HyperPod's ``elasticPolicy``; ``min == max`` is a fixed-size job."""

    model_config = ConfigDict(json_schema_extra=_schema_extra)

    min: int = Field(
        default=1, ge=1, description="Fewest replicas the job runs with.", examples=[2]
    )
    max: int | None = Field(
        default=None,
        ge=1,
        description="Most replicas; unset means `min` (a fixed-size job).",
        examples=[8],
    )
    step: int | None = Field(
        default=None,
        ge=1,
        description="Grow and shrink in steps of this many replicas from `min` "
        "(HyperPod: elasticPolicy.replicaIncrementStep). Exclusive with `discrete`.",
        examples=[2],
    )
    discrete: list[PositiveInt] | None = Field(
        default=None,
        min_length=1,
        description="The only sizes the job may run at, each within [min, max]; kept sorted "
        "(HyperPod: elasticPolicy.replicaDiscreteValues). Exclusive with `step`.",
        examples=[[2, 4, 8]],
    )

    @field_validator("discrete")
    @classmethod
    def _sorted_and_unique(cls, sizes: list[int] | None) -> list[int] | None:
        if sizes is None:
            return None
        repeated = sorted({size for size in sizes if sizes.count(size) > 1})
        if repeated:
            raise ValueError(f"replicas.discrete lists {repeated} more than once")
        return sorted(sizes)

    @model_validator(mode="after")
    def _consistent(self) -> ReplicaSpec:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"replicas.max ({self.max}) is below replicas.min ({self.min})")
        if self.step is not None and self.discrete is not None:
            raise ValueError("replicas.step and replicas.discrete exclude each other: set one")
        upper = self.upper
        outside = [size for size in self.discrete or [] if not self.min <= size <= upper]
        if outside:
            raise ValueError(
                f"replicas.discrete sizes {outside} are outside [min={self.min}, max={upper}]"
            )
        return self

    @property
    def upper(self) -> int:
        """``max``, or ``min`` where ``max`` is unset."""
        return self.min if self.max is None else self.max

    @property
    def elastic(self) -> bool:
        """Whether the job may run at more than one size, so the scaler may resize it.

        ``min < max``, unless ``step`` or ``discrete`` leave a single allowed size.
        """
        return len(self.allowed_sizes()) > 1

    def largest_size_within(self, limit: int) -> int | None:
        """The largest allowed size no greater than ``limit``; None below the smallest."""
        fitting = [size for size in self.allowed_sizes() if size <= limit]
        return fitting[-1] if fitting else None

    def allowed_sizes(self) -> list[int]:
        """Every size the job may run at, smallest first.

        ``discrete`` where given, else ``min`` to ``max`` in steps of ``step`` (default 1);
        ``[min]`` for a fixed-size job.
        """
        if self.discrete is not None:
            return list(self.discrete)
        return list(range(self.min, self.upper + 1, self.step or 1))
