"""Contract: list_worker_groups, create_worker_group and delete_worker_group."""

from __future__ import annotations

from resurge.cluster import ClusterBackend
from tests.contract.helpers import group


def keys(groups: list) -> set[tuple[str, int, str]]:  # type: ignore[type-arg]
    return {(g.job, g.replica, g.node) for g in groups}


async def test_created_groups_are_listed_all_and_by_job(backend: ClusterBackend) -> None:
    assert await backend.list_worker_groups() == []
    await backend.create_worker_group(group("a", 0, "n1"))
    await backend.create_worker_group(group("a", 1, "n2"))
    await backend.create_worker_group(group("b.v2", 0, "n1"))
    assert keys(await backend.list_worker_groups()) == {
        ("a", 0, "n1"),
        ("a", 1, "n2"),
        ("b.v2", 0, "n1"),
    }
    assert keys(await backend.list_worker_groups("a")) == {("a", 0, "n1"), ("a", 1, "n2")}
    assert keys(await backend.list_worker_groups("b.v2")) == {("b.v2", 0, "n1")}
    assert await backend.list_worker_groups("nobody") == []
    [listed] = await backend.list_worker_groups("b.v2")
    assert listed == group("b.v2", 0, "n1")


async def test_create_again_with_a_new_incarnation_replaces_the_group(
    backend: ClusterBackend,
) -> None:
    await backend.create_worker_group(group("a", 0, "n1"))
    await backend.create_worker_group(group("a", 0, "n1", incarnation=1))
    [only] = await backend.list_worker_groups("a")
    assert (only.replica, only.node, only.incarnation) == (0, "n1", 1)


async def test_delete_removes_the_group_and_is_idempotent(backend: ClusterBackend) -> None:
    await backend.create_worker_group(group("a", 0, "n1"))
    await backend.create_worker_group(group("a", 1, "n1"))
    await backend.delete_worker_group("a", 0, "n1")
    assert keys(await backend.list_worker_groups()) == {("a", 1, "n1")}
    await backend.delete_worker_group("a", 0, "n1")  # already gone
    await backend.delete_worker_group("never", 3, "n9")  # never there
    assert keys(await backend.list_worker_groups()) == {("a", 1, "n1")}
