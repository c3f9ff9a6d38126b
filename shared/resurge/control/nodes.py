"""What ``resurge node`` shows and changes: nodes, their free slots, their cordons.

:func:`node_views` lists every node a backend knows with the slots the worker groups
on it take, its health, whether it is cordoned and why, and the jobs it runs.
:func:`set_cordon` cordons or uncordons a node (idempotent; the backend's
:class:`UnknownNodeError`, a :class:`LookupError`, for a node nobody reported) and
publishes the node's CapacityChanged, so the scaler tries Pending jobs again at once.
Uncordoning says the node is fit again, so jobs that avoided it since it faulted under
them may use it again too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial

from resurge.cluster import NODE_TIMEOUT_SECONDS, ClusterBackend
from resurge.control.records import JobRecord, JobStore
from resurge.events import CapacityChanged
from resurge.runtime.bus import Bus

__all__ = ["node_views", "set_cordon"]


async def node_views(backend: ClusterBackend) -> list[dict[str, object]]:
    """One object per node, sorted by name (``resurge node list --json``)."""
    used: dict[str, int] = {}
    jobs: dict[str, set[str]] = {}
    for group in await backend.list_worker_groups():
        used[group.node] = used.get(group.node, 0) + group.nproc
        jobs.setdefault(group.node, set()).add(group.job)
    now = datetime.now(UTC)
    return [
        {
            "name": node.name,
            "slots": node.slots,
            "free": max(0, node.slots - used.get(node.name, 0)),
            "healthy": node.healthy,
            "reporting": node.alive(now, NODE_TIMEOUT_SECONDS),
            "cordoned": node.cordoned,
            "cordonReason": node.cordon_reason,
            "jobs": sorted(jobs.get(node.name, ())),
            "labels": node.labels,
        }
        for node in sorted(await backend.list_nodes(), key=lambda n: n.name)
    ]


def _stop_avoiding(record: JobRecord, node: str) -> bool:
    if node not in record.avoid_nodes:
        return False
    record.avoid_nodes = [n for n in record.avoid_nodes if n != node]
    return True


async def set_cordon(bus: Bus, backend: ClusterBackend, name: str, cordoned: bool) -> None:
    """Cordon (by hand) or uncordon ``name``, then announce its capacity.

    Raises :class:`~resurge.cluster.UnknownNodeError` (a :class:`LookupError`) for a
    node the backend does not know."""
    if cordoned:
        await backend.cordon(name, reason="cordoned by hand")
    else:
        await backend.uncordon(name)
    if not cordoned:
        store = JobStore(await bus.jobs_bucket())
        for record in await store.all():
            await store.mutate(record.name, partial(_stop_avoiding, node=name))
    node = next(n for n in await backend.list_nodes() if n.name == name)
    used = sum(g.nproc for g in await backend.list_worker_groups() if g.node == name)
    healthy = node.healthy and node.alive(datetime.now(UTC), NODE_TIMEOUT_SECONDS)
    event = CapacityChanged(
        source=bus.source,
        node=name,
        slots_total=node.slots,
        slots_free=max(0, node.slots - used) if healthy else 0,
        healthy=healthy,
        labels=node.labels,
    )
    await bus.publish(bus.subjects.capacity(name), event)
