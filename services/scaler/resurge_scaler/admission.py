"""Admission and completion for fixed-size jobs: pure functions over job records.

This first scaler places ``replicas.min`` replicas round-robin on the configured nodes
and starts them as generation 0. A job whose name was used by a finished job starts
one generation past it, so stale events of the old run stay stale.
"""

from __future__ import annotations

from resurge.events import JobPhase
from resurge.jobspec import TrainingJob
from resurge.planner import master_port_for
from resurge.records import JobRecord, Placement

__all__ = ["admit", "mark_replica_finished"]


def admit(job: TrainingJob, nodes: list[str], previous: JobRecord | None) -> JobRecord:
    generation = 0 if previous is None else previous.generation + 1
    replicas = job.spec.replicas.min
    placements = [Placement(replica=r, node=nodes[r % len(nodes)]) for r in range(replicas)]
    return JobRecord(
        name=job.name,
        spec=job,
        phase=JobPhase.RUNNING,
        generation=generation,
        placements=placements,
        master_port=master_port_for(job.name, generation),
        message=f"admitted with {replicas} replica(s)",
    )


def mark_replica_finished(record: JobRecord, replica: int, generation: int) -> bool:
    """Record that ``replica`` finished; the job succeeds when every replica has."""
    if record.phase.finished or generation != record.generation:
        return False
    if replica in record.finished_replicas:
        return False
    record.finished_replicas = sorted({*record.finished_replicas, replica})
    if len(record.finished_replicas) == len(record.placements):
        record.phase = JobPhase.SUCCEEDED
        record.pending_recovery = None
        record.message = f"every replica finished in generation {generation}"
    return True
