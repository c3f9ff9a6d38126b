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
    """Where a job is in its life, as ``resurge status`` shows it."""

    PENDING = "Pending"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    RESIZING = "Resizing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        """Whether the job is over (Succeeded or Failed): nothing will restart it."""
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED)


class FaultScope(StrEnum):
    """How far a fault reaches: one process, one node, or the whole job."""

    PROCESS = "process"
    NODE = "node"
    JOB = "job"
