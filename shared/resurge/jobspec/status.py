"""``status``: what resurge reports about a job. Written by resurge, never by users.

:class:`TrainingJobStatus` is the one model of a job's status: every field of the
``resurge status --json`` view, plus what a TrainingJob's status subresource carries on
Kubernetes (``observedGeneration``, ``submittedGeneration``, ``conditions``,
``restartCount``, ``startTime``, ``completionTime``). The CRD's status schema is
generated from it, and the status the Kubernetes backend writes is dumped from it, so
the two cannot drift apart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, NonNegativeInt

from resurge.contract.vocabulary import FaultScope, JobPhase, RecoveryLevel
from resurge.jobspec._base import SpecModel

__all__ = [
    "CONDITION_TYPES",
    "PHASE_CONDITION_TYPES",
    "PODS_REFUSED",
    "CheckpointRef",
    "Condition",
    "FaultSummary",
    "HeldGrowSummary",
    "PendingRecoverySummary",
    "RecoverySummary",
    "ReplicaCounts",
    "ResizeSummary",
    "RestoredSummary",
    "TrainingJobStatus",
]

# The condition types resurge writes: the job's phases (and Created, Suspended), written
# with its status by the status writer, and PodsRefused, written by the Kubernetes
# controller.
PHASE_CONDITION_TYPES = (
    "Created",
    "Running",
    "Recovering",
    "Resizing",
    "Succeeded",
    "Failed",
    "Suspended",
)
PODS_REFUSED = "PodsRefused"
CONDITION_TYPES = (*PHASE_CONDITION_TYPES, PODS_REFUSED)

# metav1.Condition's validation (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
_CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


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


class RestoredSummary(SpecModel):
    """Where the state of the newest generation whose ranks registered it came from."""

    generation: int = Field(ge=0, description="The generation that resumed.")
    step: int | None = Field(
        default=None,
        ge=0,
        description="The step it resumed from (none: its ranks started fresh).",
        examples=[119],
    )
    sources: dict[str, NonNegativeInt] = Field(
        default_factory=dict,
        description="Ranks that took their state from each source: `memory` (their own "
        "node's live snapshot), `peer` (another rank's), `disk` (no complete live copy: the "
        "disk checkpoint), `start` (nothing to resume from).",
        examples=[{"memory": 2, "peer": 1}],
    )
    detail: str = Field(
        default="",
        description="Why, in words, from the worst source's first rank (a fresh start, "
        "then the disk, then a peer, then memory).",
    )


class RecoverySummary(SpecModel):
    """The latest recovery that finished, in short."""

    level: RecoveryLevel = Field(description="The ladder level it restarted at.")
    reason: str = Field(description="The fault it recovered from.")
    seconds: float | None = Field(
        default=None,
        ge=0,
        description="From the fault to the first progress report after it (none until then).",
    )
    generation: int = Field(ge=0, description="The generation it recovered into.")


class PendingRecoverySummary(SpecModel):
    """A recovery under way, in short."""

    level: RecoveryLevel = Field(description="The ladder level it restarts at.")
    reason: str = Field(description="The fault it recovers from.")
    to_generation: int = Field(ge=0, description="The generation it restarts into.")
    dispatched: bool = Field(
        default=False, description="Whether every command of the restart has gone out."
    )


class Condition(SpecModel):
    """One aspect of the job's state, as Kubernetes' ``metav1.Condition``."""

    type: str = Field(
        max_length=316,
        pattern=_CONDITION_TYPE,
        description="What the condition is about: " + ", ".join(CONDITION_TYPES) + ".",
        examples=["Succeeded"],
    )
    status: Literal["True", "False", "Unknown"] = Field(
        description="Whether it holds: True, False or Unknown."
    )
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="The TrainingJob's metadata.generation the condition was set from.",
    )
    last_transition_time: datetime = Field(description="When its status last changed.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=_CONDITION_REASON,
        description="Why it last changed, in CamelCase.",
        examples=["Succeeded"],
    )
    message: str = Field(max_length=32768, description="Why it last changed, in words.")


class TrainingJobStatus(SpecModel):
    """What resurge reports about a job: phase, generation, restarts, last fault.

    The fields of ``resurge status --json`` first, then those only the TrainingJob's
    status subresource carries (Kubernetes).
    """

    name: str | None = Field(default=None, description="The job's name.")
    uid: str | None = Field(
        default=None, description="This run's id; a job submitted again under its name is new."
    )
    submitted: datetime | None = Field(default=None, description="When this run was submitted.")
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
    last_recovery: RecoverySummary | None = Field(
        default=None, description="The latest recovery that finished."
    )
    recovery: PendingRecoverySummary | None = Field(
        default=None, description="The recovery under way (none when none is)."
    )
    last_resize: ResizeSummary | None = Field(default=None, description="The latest resize.")
    held_grow: HeldGrowSummary | None = Field(
        default=None, description="A grow that waits, and until when (none when none waits)."
    )
    avoid_nodes: list[str] = Field(
        default_factory=list, description="Nodes the job is kept off (repeat offenders)."
    )
    spare_nodes: list[str] = Field(
        default_factory=list, description="Nodes held as the job's hot spares."
    )
    latest_checkpoint: CheckpointRef | None = Field(
        default=None, description="The latest checkpoint every rank has completed."
    )
    restored: RestoredSummary | None = Field(
        default=None,
        description="Where the latest generation's registered state came from: live memory, "
        "peers or the disk checkpoint (none until a rank that registered state reports it).",
    )
    message: str = Field(default="", description="A sentence on the current phase.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="The TrainingJob's metadata.generation this status was written from "
        "(Kubernetes only).",
    )
    submitted_generation: int | None = Field(
        default=None,
        ge=0,
        description="The TrainingJob's metadata.generation last submitted (Kubernetes only).",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="The job's conditions, one per type, as Kubernetes' metav1.Condition: "
        "`kubectl wait --for=condition=Succeeded` waits for the job to succeed "
        "(Kubernetes only).",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    restart_count: int = Field(
        default=0, ge=0, description="Restarts of every level (Kubernetes only)."
    )
    start_time: datetime | None = Field(
        default=None, description="When the job first ran (Kubernetes only)."
    )
    completion_time: datetime | None = Field(
        default=None, description="When the job succeeded or failed (Kubernetes only)."
    )
