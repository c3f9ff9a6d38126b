"""Taking a node out of the local cluster, against a real nats-server: the being-removed
cordon (over any other), the backend forgetting a node, and ``remove_node`` waiting for
the worker groups to leave and then for the supervisor to forget the node."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from resurge.cluster import NodeInfo, UnknownNodeError, WorkerGroupSpec
from resurge.cluster.local.backend import LocalBackend
from resurge.control.effects.nodes import (
    REMOVING_REASON,
    is_being_removed,
    mark_for_removal,
    set_cordon,
)
from resurge.events import CapacityChanged
from resurge.local.membership import MembershipError, remove_node
from resurge.local.node_set import NodeSet
from resurge.runtime.bus import Bus
from tests.collect import Events


def _group(job: str, node: str) -> WorkerGroupSpec:
    return WorkerGroupSpec(job=job, replica=0, node=node, nproc=1, command=["true"])


async def _node(backend: LocalBackend, name: str) -> NodeInfo | None:
    return next((n for n in await backend.list_nodes() if n.name == name), None)


async def test_removal_cordons_over_a_cordon_by_hand_and_announces_it(bus: Bus) -> None:
    backend = await LocalBackend.open(bus)
    await backend.report_node(NodeInfo(name="n1", slots=2))
    await set_cordon(bus, backend, "n1", cordoned=True)
    events = Events()
    sub = await bus.subscribe(bus.subjects.capacity("n1"), events.add)
    await bus.nc.flush()
    try:
        await mark_for_removal(bus, backend, "n1")
        node = await _node(backend, "n1")
        assert node is not None and is_being_removed(node)
        assert node.cordon_reason == REMOVING_REASON
        [event] = await events.wait_for(lambda _: events.of(CapacityChanged), 5)
        assert (event.node, event.slots_free, event.healthy) == ("n1", 0, False)
    finally:
        await sub.unsubscribe()
    with pytest.raises(UnknownNodeError, match="no node named 'ghost'"):
        await mark_for_removal(bus, backend, "ghost")


async def test_a_forgotten_node_is_gone_with_its_cordon(bus: Bus) -> None:
    backend = await LocalBackend.open(bus)
    await backend.report_node(NodeInfo(name="n1", slots=1))
    await backend.report_node(NodeInfo(name="n2", slots=1))
    await backend.cordon("n1", reason=REMOVING_REASON)
    await backend.forget_node("n1")
    await backend.forget_node("never-there")
    assert [n.name for n in await backend.list_nodes()] == ["n2"]
    await backend.report_node(NodeInfo(name="n1", slots=1))  # a new node of that name
    node = await _node(backend, "n1")
    assert node is not None and not node.cordoned


async def _wanted(state_dir: Path) -> list[str]:
    node_set = NodeSet.load(state_dir)
    assert node_set is not None
    return node_set.names


async def _until_wanted(state_dir: Path, names: list[str]) -> None:
    """Until ``nodes.json`` wants ``names`` (a file another task writes: polled, bounded)."""
    for _ in range(200):
        if await _wanted(state_dir) == names:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"nodes.json never wanted {names}")


async def test_remove_waits_for_the_groups_then_for_the_node_to_be_forgotten(
    bus: Bus, tmp_path: Path
) -> None:
    backend = await LocalBackend.open(bus)
    NodeSet.fresh(2, 1).save(tmp_path)
    for name in ("node-0", "node-1"):
        await backend.report_node(NodeInfo(name=name, slots=1))
    await backend.create_worker_group(_group("stays", "node-1"))

    with pytest.raises(MembershipError, match=r"worker groups of job\(s\) stays after 0.5 s"):
        await remove_node(bus, tmp_path, "node-1", wait_seconds=0.5)
    node = await _node(backend, "node-1")
    assert node is not None and is_being_removed(node)
    assert await _wanted(tmp_path) == ["node-0", "node-1"]

    removal = asyncio.create_task(remove_node(bus, tmp_path, "node-1", wait_seconds=30))
    await asyncio.sleep(0.3)  # what must NOT happen while the group is there: given time
    assert not removal.done() and await _wanted(tmp_path) == ["node-0", "node-1"]
    await backend.delete_worker_group("stays", 0, "node-1")
    await _until_wanted(tmp_path, ["node-0"])  # the supervisor's part: it sees the file
    assert not removal.done()  # it waits until the node's record is gone
    await backend.forget_node("node-1")
    await asyncio.wait_for(removal, 10)
    assert [n.name for n in await backend.list_nodes()] == ["node-0"]


async def test_removing_an_unknown_node_names_the_nodes(bus: Bus, tmp_path: Path) -> None:
    NodeSet.fresh(1, 1).save(tmp_path)
    with pytest.raises(LookupError, match=r"no node named 'node-5' .*\(nodes: node-0\)"):
        await remove_node(bus, tmp_path, "node-5", wait_seconds=1)
