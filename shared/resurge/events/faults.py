"""Fault events published by detectors on ``fault.<job>.<scope>``."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from resurge.contract.vocabulary import FaultScope, RecoveryLevel
from resurge.events.envelope import Envelope

__all__ = ["FaultDetected", "Severity"]


class Severity(StrEnum):
    """How bad a fault is."""

    WARNING = "warning"
    ERROR = "error"
    FATAL = "fatal"


class FaultDetected(Envelope):
    """A detector found a fault, with its evidence and the cheapest fix it suggests."""

    kind: Literal["fault_detected"] = "fault_detected"
    fault_id: str = Field(
        description="Stable id of the fault: the same fault seen twice has the same id.",
        examples=["crash:train:g0:r1"],
    )
    scope: FaultScope = Field(description="What the fault takes down.")
    reason: str = Field(description="Short machine-readable cause.", examples=["process_crash"])
    severity: Severity = Field(default=Severity.ERROR, description="How bad it is.")
    message: str = Field(default="", description="What happened, in words.")
    evidence: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, description="Facts that led to the fault (exit code, signal, ...)."
    )
    suggested_level: RecoveryLevel | None = Field(
        default=None, description="Cheapest recovery level the detector thinks will fix it."
    )
    alert_only: bool = Field(
        default=False,
        description="Reported for people and dashboards; the restarter does not act on it.",
    )
