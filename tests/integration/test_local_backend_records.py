"""The local backend and records it did not write: a worker-group record that is not a
valid spec (written by hand, or by an older version) is skipped, never fatal."""

from __future__ import annotations

import asyncio

from resurge.cluster import WorkerGroupSpec, open_backend
from resurge.cluster.local.backend import LocalBackend
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings


def _group(job: str, node: str) -> WorkerGroupSpec:
    return WorkerGroupSpec(job=job, replica=0, node=node, nproc=1, command=["true"])


async def test_a_bad_worker_group_record_is_skipped_by_list_and_watch(
    bus: Bus, settings: Settings
) -> None:
    backend = await open_backend(bus, settings)
    assert isinstance(backend, LocalBackend)  # the records below are the local backend's
    await backend.create_worker_group(_group("good", "n1"))
    await backend.groups.put("n1.bad.0", b'{"job": "bad", "replica": "zero"}')

    assert [g.job for g in await backend.list_worker_groups()] == ["good"]

    changes = backend.watch("n1")
    try:
        first = await asyncio.wait_for(anext(changes), 10)
        assert first.worker_group == _group("good", "n1")
        await backend.groups.put("n1.worse.0", b"not json")
        await backend.create_worker_group(_group("later", "n1"))
        after = await asyncio.wait_for(anext(changes), 10)  # the stream lives on
        assert after.job == "later" and after.worker_group == _group("later", "n1")
    finally:
        await changes.aclose()  # type: ignore[attr-defined]  # an async generator
