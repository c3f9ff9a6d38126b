"""Contract: watch, with and without a node."""

from __future__ import annotations

from resurge.cluster import ClusterBackend, watching
from tests.contract.helpers import group, next_changes, node


async def test_watch_of_a_node_yields_its_state_then_its_changes_only(
    backend: ClusterBackend,
) -> None:
    await backend.report_node(node("n1", slots=4))
    await backend.report_node(node("n2"))
    await backend.create_worker_group(group("a", 0, "n1"))
    await backend.create_worker_group(group("a", 1, "n2"))
    async with watching(backend, "n1") as changes:
        now = await next_changes(changes, 2)
        assert [(c.kind, c.node, c.deleted) for c in now] == [
            ("node", "n1", False),
            ("worker_group", "n1", False),
        ]
        assert now[0].node_info is not None and now[0].node_info.slots == 4
        assert now[1].worker_group == group("a", 0, "n1")

        await backend.create_worker_group(group("b.v2", 3, "n1"))
        [created] = await next_changes(changes, 1)
        assert (created.kind, created.node, created.job, created.replica) == (
            "worker_group",
            "n1",
            "b.v2",
            3,
        )
        assert not created.deleted and created.worker_group == group("b.v2", 3, "n1")

        await backend.delete_worker_group("b.v2", 3, "n1")
        [deleted] = await next_changes(changes, 1)
        assert (deleted.kind, deleted.deleted, deleted.node, deleted.job, deleted.replica) == (
            "worker_group",
            True,
            "n1",
            "b.v2",
            3,
        )
        assert deleted.worker_group is None

        # Writes about another node come first; the next changes are n1's own.
        await backend.report_node(node("n2", slots=8))
        await backend.create_worker_group(group("c", 0, "n2"))
        await backend.delete_worker_group("a", 1, "n2")
        await backend.create_worker_group(group("d", 0, "n1"))
        await backend.report_node(node("n1", slots=6))
        after = await next_changes(changes, 2)
        assert {(c.kind, c.node, c.job) for c in after} == {
            ("worker_group", "n1", "d"),
            ("node", "n1", None),
        }


async def test_watch_of_every_node_sees_node_writes_and_cordons(backend: ClusterBackend) -> None:
    await backend.report_node(node("n1"))
    async with watching(backend) as changes:
        [first] = await next_changes(changes, 1)
        assert (first.kind, first.node) == ("node", "n1")

        await backend.report_node(node("n2", slots=8, labels={"zone": "b"}))
        [written] = await next_changes(changes, 1)
        assert (written.kind, written.node, written.deleted) == ("node", "n2", False)
        assert written.node_info is not None
        assert (written.node_info.slots, written.node_info.labels) == (8, {"zone": "b"})

        await backend.cordon("n2", reason="by hand")
        [cordoned] = await next_changes(changes, 1)
        assert (cordoned.kind, cordoned.node) == ("node", "n2")
        assert cordoned.node_info is not None and cordoned.node_info.cordoned
        assert cordoned.node_info.cordon_reason == "by hand"

        await backend.create_worker_group(group("a", 0, "n1"))
        [created] = await next_changes(changes, 1)
        assert (created.kind, created.node, created.job) == ("worker_group", "n1", "a")
