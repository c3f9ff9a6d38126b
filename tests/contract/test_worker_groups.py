"""Contract: list_worker_groups, create_worker_group and delete_worker_group."""

from __future__ import annotations

import re

from resurge.cluster import ClusterBackend
from resurge.cluster.names import worker_hostname
from resurge.local import job_factory
from tests.contract.helpers import group

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


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


async def test_a_worker_domain_is_none_or_one_every_group_hostname_makes_a_dns_name(
    backend: ClusterBackend,
) -> None:
    """A group is reached at its node's address (local; Kubernetes' host network) or at
    ``<hostname>.<domain>``, a DNS name (RFC 1123: labels of at most 63 characters, at
    most 253 in all) for every job name, also one that is no DNS label."""
    job = job_factory.job("llama-3.1-8b", nproc=1, preload=None)
    domain = backend.worker_domain(job)
    if backend.name == "local":
        assert domain is None
        return
    assert domain is not None
    name = f"{worker_hostname(group(job.name, 0, 'n1'))}.{domain}"
    assert len(name) <= 253 and all(DNS_LABEL.fullmatch(label) for label in name.split(".")), name
