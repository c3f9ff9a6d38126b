"""Words the events and the job spec share: recovery levels, job phases, fault scopes.

It imports nothing of resurge, so both ``resurge.events`` and ``resurge.jobspec`` (which
events embed) can use it without importing each other.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["FaultScope", "JobPhase", "RecoveryLevel"]


class RecoveryLevel(StrEnum):
    """Rungs of the recovery ladder, cheapest first (DESIGN section 4)."""

    IN_PROCESS = "in_process"
    PROCESS = "process"
    POD = "pod"
    NODE = "node"
    JOB = "job"


class JobPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    RESIZING = "Resizing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED)


class FaultScope(StrEnum):
    PROCESS = "process"
    NODE = "node"
    JOB = "job"
