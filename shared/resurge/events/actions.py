"""Audit events on ``action.<job>``: what the control plane decided and did."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from resurge.contract.vocabulary import JobPhase, RecoveryLevel
from resurge.events.envelope import Envelope

__all__ = ["PhaseChanged", "RecoveryFinished", "RecoveryStarted"]


class RecoveryStarted(Envelope):
    """The restarter began recovering from a fault: a new generation at ``level``."""

    kind: Literal["recovery_started"] = "recovery_started"
    fault_id: str = Field(description="The fault being recovered from.")
    level: RecoveryLevel = Field(description="Recovery level chosen.")
    reason: str = Field(description="The fault's reason.")
    from_generation: int = Field(ge=0, description="Generation that failed.")
    to_generation: int = Field(ge=0, description="Generation being started.")


class RecoveryFinished(Envelope):
    """A recovery ended: the new generation showed its first sign of life."""

    kind: Literal["recovery_finished"] = "recovery_finished"
    fault_id: str = Field(description="The fault recovered from.")
    level: RecoveryLevel = Field(description="Recovery level used.")
    reason: str = Field(default="", description="The fault's reason.")
    duration_seconds: float = Field(
        ge=0, description="From the fault's detection to the new generation's first sign of life."
    )


class PhaseChanged(Envelope):
    """A job moved to another phase (Pending, Running, Recovering, ...)."""

    kind: Literal["phase_changed"] = "phase_changed"
    phase: JobPhase = Field(description="The job's new phase.")
    previous: JobPhase | None = Field(default=None, description="The phase before.")
    message: str = Field(default="", description="Why, in words.")
