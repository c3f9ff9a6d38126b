"""Asking for a node's drain and waiting for it (``resurge node drain``).

:func:`drain_node` writes a drain into the node's health record
(:class:`~resurge.control.state.node_health.Drain`; a drain still being done is waited
for instead of asked again), then watches the record until the restarter has moved
every job off the node (``resurge_restarter.node_drains``) and says what it did per job.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

from resurge.cluster import ClusterBackend
from resurge.contract.subjects import escape_token
from resurge.control.state.node_health import Drain, NodeHealth, NodeHealthStore, ask_drain
from resurge.runtime.bus import Bus

__all__ = ["DrainTimeout", "drain_node"]


class DrainTimeout(TimeoutError):
    """The drain was not done in time; ``drain`` is how far it got."""

    def __init__(self, drain: Drain | None) -> None:
        super().__init__("the drain was not done in time")
        self.drain = drain


async def drain_node(bus: Bus, backend: ClusterBackend, node: str, within: float) -> Drain:
    """Ask the restarter to drain ``node`` and wait (at most ``within`` seconds) until it
    did; the drain, done. LookupError for a node the cluster does not list, or where no
    restarter ever ran; :class:`DrainTimeout` when not done in time."""
    names = {info.name for info in await backend.list_nodes()}
    if node not in names:
        known = ", ".join(sorted(names)) or "none"
        raise LookupError(f"no node named {node!r} (nodes: {known})")
    kv = await bus.node_health_bucket(create=False)
    if kv is None:
        raise LookupError("no restarter has run on this cluster: nothing would drain the node")
    store = NodeHealthStore(kv)
    watcher = await kv.watch(escape_token(node))
    try:
        now = datetime.now(UTC)
        _, after = await store.mutate(
            node, lambda r: ask_drain(r, now, "operator", "resurge node drain")
        )
        asked = after.drain
        assert asked is not None
        latest: Drain | None = asked
        try:
            async with asyncio.timeout(within):
                async for entry in watcher:
                    if entry is None or not entry.value:
                        continue
                    seen = NodeHealth.model_validate_json(entry.value).drain
                    if seen is None or seen.requested != asked.requested:
                        continue
                    latest = seen
                    if seen.done is not None:
                        return seen
        except TimeoutError:
            raise DrainTimeout(latest) from None
        raise DrainTimeout(latest)
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]  # nats.py: untyped
