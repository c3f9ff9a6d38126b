"""A resize the decision chose, written into a job record: pure functions, no I/O.

:func:`apply_resize` edits a copy of a Running job's record (the scaler writes it with
one compare-and-set, so a restart decided meanwhile wins and the resize is dropped):

- grow or shrink: the next generation, at the new placements. Replicas that stay keep
  their index and node; an added replica takes the lowest index the job never used
  (its worker group is new: its incarnation goes up; the replicas that go keep an
  entry in ``incarnations``, so their indices are never given out again). The plan in
  ``pending_recovery`` (``resize`` set) is what the restarter carries out, as it does a
  recovery's: Stop to ``stop_placements``, their worker groups deleted, worker groups
  created for ``recreate`` (the added replicas; the scaler created and warmed them
  already, so writing them again changes nothing), then Assign(g+1) to every replica.
  Where the job's workers run under ``resurge.worker.restartable`` the level is
  ``in_process`` and only the replicas that go are stopped: the others re-enter their
  training function at the new world size and only added replicas start processes.
  Otherwise the level is ``process`` and every old replica is stopped. The phase is
  Resizing until the new generation's first step.
- suspend: back to Pending with its checkpoint (a requeue: every worker group deleted,
  nothing assigned); admission resumes it later, from that checkpoint.

Restart counts and the restart history are left alone: a resize is not a restart.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import datetime

from resurge.control.decisions.elastic_decision import Kind, Resize
from resurge.control.decisions.lifecycle import move_to
from resurge.control.decisions.planner import master_port_for
from resurge.control.state.records import JobRecord, LastResize, PendingRecovery, Placement
from resurge.events import JobPhase, RecoveryLevel

__all__ = ["apply_resize", "removed_nodes"]


def removed_nodes(record: JobRecord, resize: Resize) -> list[str]:
    """The nodes of the replicas ``resize`` removes (positions in replica order)."""
    ordered = sorted(record.placements, key=lambda p: p.replica)
    return [ordered[i].node for i in resize.remove if i < len(ordered)]


def apply_resize(
    record: JobRecord,
    resize: Resize,
    *,
    generation: int,
    addresses: Mapping[str, str],
    now: datetime,
) -> bool:
    """Write ``resize`` (decided on ``record`` at ``generation``) into ``record``.

    False, and nothing changed, when the record moved on since the decision: another
    generation, a recovery or resize pending, not Running, or another replica count.
    ``addresses`` maps a node to the address other replicas reach it at.
    """
    if record.phase is not JobPhase.RUNNING or record.pending_recovery is not None:
        return False
    ordered = sorted(record.placements, key=lambda p: p.replica)
    if record.generation != generation or len(ordered) != resize.from_replicas:
        return False
    if resize.kind not in (Kind.GROW, Kind.SHRINK, Kind.SUSPEND):
        return False
    if any(i >= len(ordered) for i in resize.remove):
        return False
    gone = set(resize.remove)
    kept = [p for i, p in enumerate(ordered) if i not in gone]
    added = _added(record, kept, resize.add, addresses)
    suspend = resize.kind is Kind.SUSPEND
    in_process = record.in_process_capable and not suspend
    level = RecoveryLevel.IN_PROCESS if in_process else RecoveryLevel.PROCESS
    stop = [ordered[i] for i in sorted(gone)] if in_process else ordered
    for p in (ordered[i] for i in gone):  # its index is used: never given out again
        record.incarnations = {
            **record.incarnations,
            p.replica: record.incarnations.get(p.replica, 0),
        }
    from_generation = record.generation
    record.generation += 1
    record.placements = [] if suspend else kept + added
    record.target_replicas = len(record.placements)
    record.master_port = master_port_for(record.name, record.generation, record.uid)
    record.finished_replicas = []
    record.alive_since = None
    record.resume_step = None if record.latest_checkpoint is None else record.latest_checkpoint.step
    reason = f"{resize.kind.value} {resize.from_replicas} -> {resize.to_replicas}"
    record.last_resize = LastResize(
        time=now,
        resize=resize.kind.value,
        from_replicas=resize.from_replicas,
        to_replicas=resize.to_replicas,
        why=resize.why,
        to_generation=record.generation,
    )
    if suspend:
        move_to(record, JobPhase.PENDING, f"suspended: {resize.why}")
        record.spare_nodes = []
    else:
        move_to(record, JobPhase.RESIZING, f"resizing: {resize.why}")
    record.pending_recovery = PendingRecovery(
        fault_id=f"resize-{record.generation}",
        level=level,
        reason=reason,
        detected_at=now,
        from_generation=from_generation,
        to_generation=record.generation,
        stop_placements=stop,
        recreate=[p.replica for p in added],
        requeue=suspend,
        start_at=now,
        resize=resize.kind.value,
    )
    return True


def _added(
    record: JobRecord, kept: list[Placement], nodes: tuple[str, ...], addresses: Mapping[str, str]
) -> list[Placement]:
    """A placement per node in ``nodes``, at the lowest replica indices this job never
    used (a new replica's agent must not find an old replica's commands on its subject);
    each one's incarnation goes up, so its worker group is a new one."""
    used = {p.replica for p in kept} | set(record.incarnations)
    free = (i for i in itertools.count() if i not in used)
    added = []
    for node in nodes:
        replica = next(free)
        added.append(
            Placement(replica=replica, node=node, address=addresses.get(node, "127.0.0.1"))
        )
        record.incarnations = {
            **record.incarnations,
            replica: record.incarnations.get(replica, 0) + 1,
        }
    return added
