"""Contract: list_nodes, live_nodes and report_node."""

from __future__ import annotations

from resurge.cluster import NODE_TIMEOUT_SECONDS, ClusterBackend
from resurge.local.job_factory import job
from tests.contract.helpers import node


async def test_list_nodes_shows_what_report_node_wrote(backend: ClusterBackend) -> None:
    assert await backend.list_nodes() == []
    await backend.report_node(
        node("gpu-1", slots=4, healthy=False, address="10.0.0.7", labels={"zone": "a"})
    )
    await backend.report_node(node("gpu-2", slots=8))
    listed = {n.name: n for n in await backend.list_nodes()}
    assert set(listed) == {"gpu-1", "gpu-2"}
    one = listed["gpu-1"]
    assert (one.slots, one.healthy, one.address, one.labels) == (
        4,
        False,
        "10.0.0.7",
        {"zone": "a"},
    )
    assert not one.cordoned and not one.schedulable
    assert listed["gpu-2"].slots == 8 and listed["gpu-2"].schedulable


async def test_report_node_again_replaces_the_record(backend: ClusterBackend) -> None:
    await backend.report_node(node("gpu-1", slots=4))
    await backend.report_node(node("gpu-1", slots=2, labels={"zone": "b"}))
    [only] = await backend.list_nodes()
    assert (only.name, only.slots, only.labels) == ("gpu-1", 2, {"zone": "b"})


async def test_live_nodes_drops_a_node_whose_heartbeat_is_old(backend: ClusterBackend) -> None:
    await backend.report_node(node("fresh"))
    await backend.report_node(node("stale", age_seconds=NODE_TIMEOUT_SECONDS + 60))
    assert {n.name for n in await backend.live_nodes()} == {"fresh"}
    assert {n.name for n in await backend.list_nodes()} == {"fresh", "stale"}
    await backend.report_node(node("stale"))  # its monitor writes again
    assert {n.name for n in await backend.live_nodes()} == {"fresh", "stale"}


async def test_a_job_without_placement_constraints_may_use_every_node(
    backend: ClusterBackend,
) -> None:
    """unfit_nodes: a job whose spec constrains nothing (no template: local has none,
    and on Kubernetes no selector, affinity or toleration is needed on untainted
    nodes) may use every node, whatever its labels; and nothing else holds slots of a
    node the backend's records do not (no other pods)."""
    await backend.report_node(node("gpu-1", slots=4, labels={"zone": "a"}))
    await backend.report_node(node("gpu-2", slots=4))
    nodes = await backend.list_nodes()
    assert backend.unfit_nodes(job("llama"), nodes) == {}
    assert [n.in_use_elsewhere for n in nodes] == [0, 0]
