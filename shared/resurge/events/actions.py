"""Audit events on ``action.<job>``: what the control plane decided and did."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from resurge.contract.vocabulary import JobPhase, RecoveryLevel
from resurge.events.envelope import Envelope

__all__ = ["PhaseChanged", "RecoveryFinished", "RecoveryStarted", "ScaleDecided"]


class RecoveryStarted(Envelope):
    """The restarter began recovering from a fault: a new generation at ``level``."""

    kind: Literal["recovery_started"] = "recovery_started"
    fault_id: str = Field(description="The fault being recovered from.")
    level: RecoveryLevel = Field(description="Recovery level chosen.")
    reason: str = Field(description="The fault's reason.")
    from_generation: int = Field(ge=0, description="Generation that failed.")
    to_generation: int = Field(ge=0, description="Generation being started.")


class RecoveryFinished(Envelope):
    """A recovery ended: the new generation trained (its first step past its resume
    point, or for a script that reports no progress its ranks passed their rendezvous).

    A recovery whose generation faults before that never ends: none is published."""

    kind: Literal["recovery_finished"] = "recovery_finished"
    fault_id: str = Field(description="The fault recovered from.")
    level: RecoveryLevel = Field(description="Recovery level used.")
    reason: str = Field(default="", description="The fault's reason.")
    duration_seconds: float = Field(
        ge=0,
        description="From the fault's detection to the new generation's training: its first "
        "step, or its ranks passing their rendezvous.",
    )


class PhaseChanged(Envelope):
    """A job moved to another phase (Pending, Running, Recovering, ...)."""

    kind: Literal["phase_changed"] = "phase_changed"
    phase: JobPhase = Field(description="The job's new phase.")
    previous: JobPhase | None = Field(default=None, description="The phase before.")
    message: str = Field(default="", description="Why, in words.")


class ScaleDecided(Envelope):
    """The scaler changed a job's size: ``from_replicas`` to ``to_replicas``, and why.

    ``resize`` says what kind of change: ``grow`` into free capacity, ``shrink`` (to make
    room for a higher-priority job, after a node was lost, or off a node being removed),
    ``suspend`` (back to Pending with its checkpoint). The resize runs as generation
    ``to_generation``; its end is the PhaseChanged from Resizing back to Running.
    """

    kind: Literal["scale_decided"] = "scale_decided"
    resize: Literal["grow", "shrink", "suspend"] = Field(description="What kind of change.")
    from_replicas: int = Field(ge=0, description="Replicas before.")
    to_replicas: int = Field(ge=0, description="Replicas after (0 for a suspension).")
    why: str = Field(description="Why, in words.")
    from_generation: int = Field(ge=0, description="The generation running before.")
    to_generation: int = Field(ge=0, description="The generation that runs the new size.")
