"""``resurge node add``, ``remove`` and ``up``, and ``resurge inject node-down``, on the
local cluster.

Each changes the folder's wanted nodes (:mod:`resurge.local.node_set`), which the
running supervisor reconciles against, and await the outcome through the backend's
change stream (``watch``), each within a time limit:

- :func:`add_node` adds ``node-<i>`` (the next index never used) and returns its name
  once it is live in the backend (``live_nodes``); one that does not register in time
  is taken out of the set again and :class:`MembershipError` says so.
- :func:`remove_node` cordons the node with
  :data:`~resurge.control.effects.nodes.REMOVING_REASON` (so the scaler shrinks or moves the
  jobs on it), waits until no worker group is on it, then takes it out of the set and
  waits until the supervisor has stopped its monitor and forgotten its record. A worker
  group still there at the time limit is a :class:`MembershipError` naming its job;
  the node stays cordoned and wanted. An unknown name is a :class:`LookupError`.
- :func:`power_off` marks the node down (a power loss: the supervisor SIGKILLs its
  monitor, agents and workers and starts none of them again) and returns once the
  supervisor says it is (``cluster.json``'s ``down``); the node's record stays, so the
  cluster sees it go silent.
- :func:`power_on` marks it up again and returns once its monitor reports afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

from resurge.cluster import (
    NODE_TIMEOUT_SECONDS,
    ClusterBackend,
    ClusterChange,
    UnknownNodeError,
    open_backend,
    watching,
)
from resurge.control.effects.nodes import mark_for_removal
from resurge.local.node_set import NodeSet, editing
from resurge.local.state import ClusterState
from resurge.runtime.bus import Bus

__all__ = [
    "REGISTER_SECONDS",
    "STOP_SECONDS",
    "MembershipError",
    "add_node",
    "power_off",
    "power_on",
    "remove_node",
]

REGISTER_SECONDS = 60.0
"""How long :func:`add_node` waits for the new node to register."""
STOP_SECONDS = 60.0
"""How long :func:`remove_node` waits, once the node is empty, for it to be gone."""


class MembershipError(RuntimeError):
    """A node did not join or leave in time; the message says what is left as it was."""


async def _next(changes: AsyncIterator[ClusterChange], deadline: float) -> ClusterChange:
    """The next change, or :class:`TimeoutError` at ``deadline`` (loop time)."""
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(anext(changes), max(0.0, deadline - loop.time()))


async def add_node(
    bus: Bus,
    state_dir: Path,
    gpus: int | None,
    labels: dict[str, str],
    wait_seconds: float = REGISTER_SECONDS,
) -> str:
    """Add a node with ``gpus`` (default: the cluster's per node) and ``labels``; its name
    once it is live. :class:`MembershipError` when it does not register in time."""
    with editing(state_dir) as node_set:
        name = node_set.add(gpus, labels).name
    backend = await open_backend(bus, bus.settings)
    deadline = asyncio.get_running_loop().time() + wait_seconds
    async with watching(backend, name) as changes:
        try:
            while True:
                change = await _next(changes, deadline)
                info = change.node_info
                if info is not None and info.alive(datetime.now(UTC), NODE_TIMEOUT_SECONDS):
                    return name
        except TimeoutError:
            pass
    with editing(state_dir) as node_set:
        if node_set.get(name) is not None:
            node_set.remove(name)
    log = state_dir / "logs" / f"{name}.log"
    raise MembershipError(
        f"node {name} did not register within {wait_seconds:g} s, so it was taken out again "
        f"(see {log})"
    )


async def remove_node(bus: Bus, state_dir: Path, name: str, wait_seconds: float) -> None:
    """Empty ``name`` of worker groups, then take it out of the cluster (module docstring)."""
    node_set = NodeSet.load(state_dir)
    if node_set is None or node_set.get(name) is None:
        known = ", ".join(node_set.names) if node_set else "none"
        raise LookupError(f"no node named {name!r} in this local cluster (nodes: {known})")
    backend = await open_backend(bus, bus.settings)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    async with watching(backend, name) as changes:
        with contextlib.suppress(UnknownNodeError):  # never registered: nothing to cordon
            await mark_for_removal(bus, backend, name)
        try:
            while await _groups_on(backend, name):
                await _next(changes, deadline)
        except TimeoutError:
            groups = await _groups_on(backend, name)
            if groups:
                jobs = ", ".join(sorted({job for job, _ in groups}))
                raise MembershipError(
                    f"node {name} still runs worker groups of job(s) {jobs} after {wait_seconds:g} "
                    f"s; it stays cordoned and in the cluster (`resurge node uncordon {name}` "
                    "lets it take work again)"
                ) from None
        with editing(state_dir) as wanted:
            if wanted.get(name) is not None:
                wanted.remove(name)
        gone_by = loop.time() + STOP_SECONDS
        try:
            while name in {node.name for node in await backend.list_nodes()}:
                await _next(changes, gone_by)
        except TimeoutError:
            raise MembershipError(
                f"node {name} is out of the cluster's nodes, but its record was not removed "
                f"within {STOP_SECONDS:g} s: is the supervisor running? (see "
                f"{state_dir / 'logs' / 'supervisor.log'})"
            ) from None


async def _groups_on(backend: ClusterBackend, name: str) -> list[tuple[str, int]]:
    """(job, replica) of each worker group on ``name``."""
    return [(g.job, g.replica) for g in await backend.list_worker_groups() if g.node == name]


# How often power_off reads cluster.json for the supervisor's word (it wakes every 0.2 s).
_POLL_SECONDS = 0.1


async def power_off(state_dir: Path, name: str, wait_seconds: float = STOP_SECONDS) -> bool:
    """Cut ``name``'s power (module docstring); False if it was down already.
    :class:`LookupError` for an unknown node, :class:`MembershipError` when the
    supervisor does not say it is down in time."""
    with editing(state_dir) as node_set:
        changed = node_set.power(name, on=False)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while loop.time() < deadline:
        state = ClusterState.load(state_dir)
        if state is not None and name in state.down:
            return changed
        await asyncio.sleep(_POLL_SECONDS)  # another process's file: polled, bounded
    raise MembershipError(
        f"node {name} is marked down, but the supervisor did not power it off within "
        f"{wait_seconds:g} s: is it running? (see {state_dir / 'logs' / 'supervisor.log'})"
    )


async def power_on(
    bus: Bus, state_dir: Path, name: str, wait_seconds: float = REGISTER_SECONDS
) -> bool:
    """Power ``name`` on again and return once its monitor has reported; False if it was
    not down. :class:`LookupError` for an unknown node, :class:`MembershipError` when it
    does not report in time (it stays marked up: the supervisor keeps starting it)."""
    backend = await open_backend(bus, bus.settings)
    since = datetime.now(UTC)
    deadline = asyncio.get_running_loop().time() + wait_seconds
    async with watching(backend, name) as changes:
        with editing(state_dir) as node_set:
            changed = node_set.power(name, on=True)
        if not changed:
            return False
        try:
            while True:
                info = (await _next(changes, deadline)).node_info
                if info is not None and info.heartbeat > since:
                    return True
        except TimeoutError:
            raise MembershipError(
                f"node {name} was powered on but did not report within {wait_seconds:g} s "
                f"(see {state_dir / 'logs' / f'{name}.log'})"
            ) from None
