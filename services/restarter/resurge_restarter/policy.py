"""Recovery decisions: pure functions over a job record and a fault, no I/O.

:func:`apply_fault` edits a record in place and returns what to do. The record change
is written (compare-and-set) before any command goes out, so a fault is acted on once:
a fault already in ``handled_faults``, or from a generation older than the record's,
changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from resurge.events import FaultDetected, JobPhase, RecoveryLevel
from resurge.planner import master_port_for
from resurge.records import CheckpointRef, JobRecord, LastFault, PendingRecovery

__all__ = ["Decision", "Verdict", "apply_checkpoint", "apply_fault", "apply_sign_of_life"]

_CHECKPOINT_STEPS_KEPT = 8


class Verdict(Enum):
    IGNORE = "ignore"
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    why: str
    level: RecoveryLevel = RecoveryLevel.PROCESS


def apply_fault(record: JobRecord, fault: FaultDetected) -> Decision:
    if fault.alert_only:
        return Decision(Verdict.IGNORE, "an alert: reported, not acted on")
    if record.phase.finished:
        return Decision(Verdict.IGNORE, f"job is {record.phase.value}")
    if fault.fault_id in record.handled_faults:
        return Decision(Verdict.IGNORE, "fault already handled")
    if fault.generation is not None and fault.generation < record.generation:
        return Decision(
            Verdict.IGNORE,
            f"fault of generation {fault.generation}, job is at {record.generation}",
        )
    record.remember_fault(fault.fault_id)
    record.last_fault = LastFault(
        fault_id=fault.fault_id, reason=fault.reason, scope=fault.scope.value, time=fault.time
    )
    limit = record.spec.spec.recovery.max_restarts
    if record.total_restarts >= limit:
        record.phase = JobPhase.FAILED
        record.pending_recovery = None
        record.message = (
            f"{fault.reason} ({fault.fault_id}) after {record.total_restarts} restarts: "
            f"restart limit jobMaxRetryCount={limit} spent"
        )
        return Decision(Verdict.FAIL, record.message)
    level = RecoveryLevel.PROCESS
    record.generation += 1
    record.restarts[level] = record.restarts.get(level, 0) + 1
    record.master_port = master_port_for(record.name, record.generation)
    record.finished_replicas = []
    record.phase = JobPhase.RECOVERING
    record.pending_recovery = PendingRecovery(
        fault_id=fault.fault_id,
        level=level,
        detected_at=fault.time,
        to_generation=record.generation,
    )
    record.message = f"recovering from {fault.reason} at level {level.value}"
    return Decision(Verdict.RESTART, record.message, level)


def apply_sign_of_life(
    record: JobRecord, generation: int, seen_at: datetime, *, progress: bool
) -> bool:
    """A worker of ``generation`` started (``progress`` False) or completed a step (True).

    The first step of the new generation closes a pending recovery; for a job whose
    workers never report progress, the first worker start does. True if anything changed.
    """
    changed = False
    if progress and not record.reports_progress:
        record.reports_progress = True
        changed = True
    if record.reports_progress and not progress:
        return changed
    pending = record.pending_recovery
    if pending is None or pending.to_generation != generation or record.phase.finished:
        return changed
    record.pending_recovery = None
    record.last_recovery_seconds = max(0.0, (seen_at - pending.detected_at).total_seconds())
    record.phase = JobPhase.RUNNING
    record.message = f"recovered at level {pending.level.value}"
    return True


def apply_checkpoint(record: JobRecord, rank: int, step: int, path: str) -> bool:
    """Count ``rank``'s report of checkpoint ``step``; once every rank of the job has
    reported it, it becomes the resume point. True if anything changed."""
    latest = record.latest_checkpoint
    if latest is not None and step <= latest.step:
        return False
    ranks = set(record.checkpoint_reports.get(step, [])) | {rank}
    if len(ranks) >= record.world_size:
        record.latest_checkpoint = CheckpointRef(step=step, path=path)
        record.checkpoint_reports = {s: r for s, r in record.checkpoint_reports.items() if s > step}
        return True
    if ranks == set(record.checkpoint_reports.get(step, [])):
        return False
    reports = {**record.checkpoint_reports, step: sorted(ranks)}
    record.checkpoint_reports = dict(sorted(reports.items())[-_CHECKPOINT_STEPS_KEPT:])
    return True
