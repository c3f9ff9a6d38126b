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
from resurge.records import JobRecord, LastFault, PendingRecovery

__all__ = ["Decision", "Verdict", "apply_fault", "apply_sign_of_life"]


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


def apply_sign_of_life(record: JobRecord, generation: int, seen_at: datetime) -> bool:
    """The new generation is alive: close the pending recovery. True if anything changed."""
    pending = record.pending_recovery
    if pending is None or pending.to_generation != generation or record.phase.finished:
        return False
    record.pending_recovery = None
    record.last_recovery_seconds = max(0.0, (seen_at - pending.detected_at).total_seconds())
    record.phase = JobPhase.RUNNING
    record.message = f"recovered at level {pending.level.value}"
    return True
