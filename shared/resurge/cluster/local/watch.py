"""The local backend's change stream: its KV watchers turned into :class:`ClusterChange`.

:func:`watch_changes` yields every node (cordon applied) and every worker group as it
is now, then each change as it happens, until the caller stops iterating. It watches
three buckets: a node's record (its monitor's writes), its cordon (the control plane's
writes; reported as a change of the node) and the worker groups. A deleted group's
entry carries only its key, which names the node, job and replica. With ``node``, only
that node's record, cordon and groups are watched.

nats.py's KV watcher yields None once its initial values are delivered; the initial
values of each bucket are drained up to that marker before the live changes of all
three are merged, so "as it is now" comes first. A worker-group record that is not a
valid :class:`WorkerGroupSpec` is logged and skipped: one bad record never ends the
stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from nats.js.kv import KeyValue
from pydantic import ValidationError

from resurge.cluster.local.keys import node_key, parse_worker_group_key
from resurge.cluster.protocol import ClusterChange, NodeInfo, WorkerGroupSpec
from resurge.contract.subjects import unescape_token

__all__ = ["ReadNode", "watch_changes"]

ReadNode = Callable[[str], Awaitable[NodeInfo | None]]
"""Reads one node as the backend lists it (cordon applied); None if it has no record."""

_DELETES = ("DEL", "PURGE")

log = logging.getLogger("resurge.cluster.local")


async def _initial(watcher: KeyValue.KeyWatcher) -> list[KeyValue.Entry]:
    """The watcher's entries up to its end-of-initial-values marker."""
    entries = []
    async for entry in watcher:
        if entry is None:
            break
        entries.append(entry)
    return entries


async def _node_change(entry: KeyValue.Entry, read_node: ReadNode) -> ClusterChange | None:
    name = unescape_token(entry.key)
    if entry.operation in _DELETES:
        return ClusterChange(kind="node", deleted=True, node=name)
    info = await read_node(name)
    if info is None:  # removed again since
        return None
    return ClusterChange(kind="node", node=name, node_info=info)


async def _cordon_change(entry: KeyValue.Entry, read_node: ReadNode) -> ClusterChange | None:
    name = unescape_token(entry.key)
    info = await read_node(name)
    if info is None:  # a cordon outlived its node's record
        return None
    return ClusterChange(kind="node", node=name, node_info=info)


def _group_change(entry: KeyValue.Entry) -> ClusterChange | None:
    if entry.operation in _DELETES or not entry.value:
        try:
            node, job, replica = parse_worker_group_key(entry.key)
        except ValueError:
            return None
        return ClusterChange(kind="worker_group", deleted=True, node=node, job=job, replica=replica)
    try:
        spec = WorkerGroupSpec.model_validate_json(entry.value)
    except ValidationError as error:
        log.warning("skipping worker group record %s: %s", entry.key, error)
        return None
    return ClusterChange(
        kind="worker_group", node=spec.node, job=spec.job, replica=spec.replica, worker_group=spec
    )


async def _open_watcher(bucket: KeyValue, key_filter: str) -> KeyValue.KeyWatcher:
    """``bucket.watch(key_filter)``; cancelled meanwhile, the watcher it made is stopped
    (its consumer's tasks would outlive the caller otherwise)."""
    opening = asyncio.ensure_future(bucket.watch(key_filter))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            watcher = await opening
            await watcher.stop()  # type: ignore[no-untyped-call]  # nats.py: untyped
        raise


async def _pump(
    source: str,
    watcher: KeyValue.KeyWatcher,
    queue: asyncio.Queue[tuple[str, KeyValue.Entry]],
) -> None:
    async for entry in watcher:
        if entry is not None:
            await queue.put((source, entry))


async def _change(source: str, entry: KeyValue.Entry, read_node: ReadNode) -> ClusterChange | None:
    if source == "node":
        return await _node_change(entry, read_node)
    if source == "cordon":
        return await _cordon_change(entry, read_node)
    return _group_change(entry)


async def watch_changes(
    nodes: KeyValue | None,
    cordons: KeyValue | None,
    groups: KeyValue,
    read_node: ReadNode,
    node: str | None = None,
) -> AsyncGenerator[ClusterChange, None]:
    """Every node and worker group now, then each change (see the module docstring).

    Without ``nodes`` and ``cordons``, only the worker groups (a backend that keeps its
    nodes elsewhere watches those itself)."""
    node_filter = ">" if node is None else node_key(node)
    group_filter = ">" if node is None else f"{node_key(node)}.>"
    watchers: list[tuple[str, KeyValue.KeyWatcher]] = []
    pumps: list[asyncio.Task[None]] = []
    try:
        # Cordons first: a cordon set while the nodes are read arrives as a change.
        for source, bucket, key_filter in (
            ("cordon", cordons, node_filter),
            ("node", nodes, node_filter),
            ("group", groups, group_filter),
        ):
            if bucket is None:
                continue
            watcher = await _open_watcher(bucket, key_filter)
            watchers.append((source, watcher))
            for entry in await _initial(watcher):
                change = None if source == "cordon" else await _change(source, entry, read_node)
                if change is not None:
                    yield change
        queue: asyncio.Queue[tuple[str, KeyValue.Entry]] = asyncio.Queue()
        pumps.extend(asyncio.create_task(_pump(s, w, queue)) for s, w in watchers)
        while True:
            source, entry = await queue.get()
            change = await _change(source, entry, read_node)
            if change is not None:
                yield change
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for _, watcher in watchers:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]  # nats.py: untyped
