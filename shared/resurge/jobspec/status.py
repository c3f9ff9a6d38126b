"""``status``: what resurge reports about a job. Written by resurge, never by users."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field, NonNegativeInt

from resurge.contract.vocabulary import FaultScope, JobPhase, RecoveryLevel
from resurge.jobspec._base import SpecModel

__all__ = [
    "CheckpointRef",
    "FaultSummary",
    "HeldGrowSummary",
    "ReplicaCounts",
    "ResizeSummary",
    "TrainingJobStatus",
]


def _pending() -> JobPhase:
    return JobPhase.PENDING


class ReplicaCounts(SpecModel):
    """Replicas running now, and how many the scaler wants."""

    current: int = Field(default=0, ge=0, description="Replicas running now.")
    target: int = Field(default=0, ge=0, description="Replicas the scaler wants.")


class FaultSummary(SpecModel):
    """The last fault, in short."""

    reason: str = Field(description="What went wrong.", examples=["exit code 1 on rank 0"])
    scope: FaultScope = Field(description="How much of the job the fault takes down.")
    time: datetime = Field(description="When the fault was detected.")


class ResizeSummary(SpecModel):
    """The last resize, in short."""

    resize: str = Field(description="`grow`, `shrink` or `suspend`.", examples=["grow"])
    from_: int = Field(alias="from", ge=0, description="Replicas before.")
    to: int = Field(ge=0, description="Replicas after.")
    why: str = Field(default="", description="Why the scaler resized the job.")
    time: datetime = Field(description="When the scaler decided it.")
    seconds: float | None = Field(
        default=None, ge=0, description="From the decision to the first step at the new size."
    )


class HeldGrowSummary(SpecModel):
    """A grow that free slots allow and a wait holds back, in short."""

    to: int = Field(ge=1, description="Replicas it would grow to.")
    why: str = Field(
        description="What holds it: the cool-down after its last resize, the snooze after "
        "a restart, or capacity still arriving.",
        examples=["the snooze after a restart"],
    )
    until: datetime = Field(description="When that wait ends.")


class CheckpointRef(SpecModel):
    """A checkpoint: its training step and where it lies."""

    step: int = Field(ge=0, description="Training step of the checkpoint.")
    path: str = Field(description="Where the checkpoint lies.")


class TrainingJobStatus(SpecModel):
    """What resurge reports about a job: phase, generation, restarts, last fault."""

    phase: JobPhase = Field(default_factory=_pending, description="Where the job is now.")
    generation: int = Field(
        default=0, ge=0, description="Current generation; every restart or resize adds one."
    )
    replicas: ReplicaCounts = Field(
        default_factory=ReplicaCounts, description="Replicas running and wanted."
    )
    restarts: dict[RecoveryLevel, NonNegativeInt] = Field(
        default_factory=dict, description="Restarts so far at each level."
    )
    last_fault: FaultSummary | None = Field(default=None, description="The latest fault.")
    last_recovery_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Seconds from the latest fault to the first progress report after it.",
    )
    last_resize: ResizeSummary | None = Field(default=None, description="The latest resize.")
    held_grow: HeldGrowSummary | None = Field(
        default=None, description="A grow that waits, and until when (none when none waits)."
    )
    latest_checkpoint: CheckpointRef | None = Field(
        default=None, description="The latest checkpoint every rank has completed."
    )
    message: str = Field(default="", description="A sentence on the current phase.")
