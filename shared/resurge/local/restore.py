"""A local cluster starting again: nothing it ran before is running now.

``resurge down`` (or a crash of the whole machine) ends every worker, but the job
records and worker groups in JetStream outlive it. Before the services of a starting
local cluster run, :func:`restore` requeues every job that had not finished: its
worker groups are deleted, it goes back to Pending with a new generation and new
incarnations (so neither stale events nor old agents' command positions reach the
new run), and the scaler starts it again, from its newest checkpoint every rank
saved, once it fits. A plan in flight is dropped: the new start replaces it. Cordons
stay, as a Kubernetes node's do; ``resurge node list`` shows them and ``resurge node
uncordon`` lifts them.
"""

from __future__ import annotations

import logging

from resurge.cluster import open_backend
from resurge.control.decisions.lifecycle import move_to
from resurge.control.effects.job_messages import announce_phase
from resurge.control.state.records import JobRecord, JobStore
from resurge.control.views.timeline import CLUSTER_RESTARTED
from resurge.events import JobPhase
from resurge.runtime.bus import Bus

__all__ = ["requeue_after_restart", "restore"]

log = logging.getLogger("resurge.supervisor")


def requeue_after_restart(record: JobRecord) -> bool:
    """Put an unfinished job back to Pending to resume from its checkpoint (pure)."""
    if record.phase.finished:
        return False
    replicas = {p.replica for p in record.placements} | set(record.incarnations)
    record.incarnations = {r: record.incarnations.get(r, 0) + 1 for r in sorted(replicas)}
    record.generation += 1
    record.placements = []
    record.spare_nodes = []
    record.pending_recovery = None
    record.finished_replicas = []
    record.alive_since = None
    checkpoint = record.latest_checkpoint
    resume = "the start" if checkpoint is None else f"checkpoint step {checkpoint.step}"
    move_to(
        record,
        JobPhase.PENDING,
        f"{CLUSTER_RESTARTED}: waiting for capacity to resume from {resume}",
    )
    return True


async def restore(bus: Bus) -> list[str]:
    """Requeue every unfinished job and delete every worker group; the jobs requeued."""
    store = JobStore(await bus.jobs_bucket())
    backend = await open_backend(bus, bus.settings)
    for group in await backend.list_worker_groups():
        await backend.delete_worker_group(group.job, group.replica, group.node)
    requeued = []
    for record in await store.all():
        result = await store.mutate(record.name, requeue_after_restart)
        if result is None or result[0] is result[1]:
            continue
        before, after = result
        requeued.append(after.name)
        was = f"{before.phase.value} at generation {before.generation}"
        log.info("%s was %s: %s", after.name, was, after.message)
        await announce_phase(bus, before.phase, after)
    return requeued
