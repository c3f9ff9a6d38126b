"""What ``resurge node`` shows and changes: nodes, their free slots, their cordons.

:func:`node_views` lists every node a backend knows with its slots in use (the one
cluster snapshot, :mod:`resurge.control.views.cluster_snapshot`), its health, whether it is
cordoned and why, and the jobs it runs.
:func:`set_cordon` cordons or uncordons a node (idempotent; the backend's
:class:`UnknownNodeError`, a :class:`LookupError`, for a node nobody reported) and
publishes the node's CapacityChanged, so the scaler tries Pending jobs again at once.
Uncordoning says the node is fit again, so jobs that avoided it since it faulted under
them may use it again too.

A node on its way out of the cluster (``resurge node remove``) is cordoned with
:data:`REMOVING_REASON` by :func:`mark_for_removal`; :func:`is_being_removed` tells it
apart from any other cordon, so the scaler shrinks or moves the jobs on it at once.
:func:`parse_label` reads a ``key=value`` node label as ``--label`` gives it, with a
Kubernetes-style key and value.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import partial

from resurge.cluster import NODE_TIMEOUT_SECONDS, ClusterBackend, NodeInfo
from resurge.control.state.allocations import Allocations, open_allocations
from resurge.control.state.records import JobRecord, JobStore
from resurge.control.views.cluster_snapshot import (
    ClusterReads,
    ClusterSnapshot,
    build_snapshot,
    read_snapshot,
)
from resurge.events import CapacityChanged
from resurge.runtime.bus import Bus

__all__ = [
    "REMOVING_REASON",
    "bus_node_views",
    "is_being_removed",
    "mark_for_removal",
    "node_views",
    "parse_label",
    "set_cordon",
]

REMOVING_REASON = "being removed from the cluster"
"""The cordon reason of a node that ``resurge node remove`` is taking away."""

# A label's name, and its value when not empty: 63 characters at most, alphanumeric at
# both ends, '-', '_' and '.' between (Kubernetes' rules for label keys and values).
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
# A key's optional prefix: a DNS subdomain of at most 253 characters.
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_being_removed(node: NodeInfo) -> bool:
    """Whether ``node`` is cordoned because ``resurge node remove`` is taking it away."""
    return node.cordoned and node.cordon_reason == REMOVING_REASON


def parse_label(text: str) -> tuple[str, str]:
    """``key=value`` as (key, value); :class:`ValueError`, naming ``text``, when the key
    (``[prefix/]name``) or the value breaks Kubernetes' label rules."""
    key, equals, value = text.partition("=")
    if not equals:
        raise ValueError(f"label {text!r} is not key=value")
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _PREFIX.fullmatch(prefix)):
        raise ValueError(
            f"label {text!r}: key prefix {prefix!r} is not a DNS subdomain "
            "(lowercase letters, digits, '-' and '.')"
        )
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"label {text!r}: key name {name!r} must be 1-63 characters, letters or digits "
            "at both ends, '-', '_' or '.' between"
        )
    if value and not _NAME.fullmatch(value):
        raise ValueError(
            f"label {text!r}: value {value!r} must be empty or 1-63 characters, letters or "
            "digits at both ends, '-', '_' or '.' between"
        )
    return key, value


async def node_views(
    backend: ClusterBackend, store: JobStore | None = None, allocations: Allocations | None = None
) -> list[dict[str, object]]:
    """One object per node, sorted by name (``resurge node list --json``), its free
    slots and jobs from the one cluster snapshot
    (:func:`~resurge.control.views.cluster_snapshot.read_snapshot`: replicas, held spares,
    worker groups, placements claimed). Without ``store`` (no job records at hand) only
    worker groups and claims count."""
    snapshot = await _snapshot(backend, store, allocations)
    used = snapshot.used()
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
            "jobs": snapshot.jobs_on(node.name),
            "labels": node.labels,
        }
        for node in sorted(snapshot.known, key=lambda n: n.name)
    ]


async def _snapshot(
    backend: ClusterBackend, store: JobStore | None, allocations: Allocations | None
) -> ClusterSnapshot:
    if store is not None:
        return await read_snapshot(ClusterReads.of(backend), store, allocations)
    claims, revision = ([], 0) if allocations is None else await allocations.read()
    return build_snapshot(
        await backend.live_nodes(),
        (),
        await backend.list_worker_groups(),
        claims,
        known=await backend.list_nodes(),
        revision=revision,
    )


async def bus_node_views(bus: Bus, backend: ClusterBackend) -> list[dict[str, object]]:
    """:func:`node_views` with the job records and the ledger on ``bus``."""
    store = JobStore(await bus.jobs_bucket())
    return await node_views(backend, store, await open_allocations(bus, "cli", create=False))


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
    await _announce(bus, backend, name)


async def mark_for_removal(bus: Bus, backend: ClusterBackend, name: str) -> None:
    """Cordon ``name`` with :data:`REMOVING_REASON`, then announce its capacity.

    A node cordoned for another reason (by hand, after a fault) is cordoned again with
    this one: uncordoned and at once cordoned, as a cordon keeps its first reason.
    Raises :class:`~resurge.cluster.UnknownNodeError` for a node the backend does not
    know."""
    await backend.cordon(name, reason=REMOVING_REASON)
    node = next(n for n in await backend.list_nodes() if n.name == name)
    if not is_being_removed(node):
        await backend.uncordon(name)
        await backend.cordon(name, reason=REMOVING_REASON)
    await _announce(bus, backend, name)


async def _announce(bus: Bus, backend: ClusterBackend, name: str) -> None:
    """Publish ``name``'s CapacityChanged as the cluster snapshot sees the node now."""
    store = JobStore(await bus.jobs_bucket())
    allocations = await open_allocations(bus, "cli", create=False)
    snapshot = await read_snapshot(ClusterReads.of(backend), store, allocations)
    node = next(n for n in snapshot.known if n.name == name)
    used = snapshot.used().get(name, 0)
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
