"""A quarantined node leaves quarantine after a clean health check, and only then: real
torch (gloo) workers of a plain script that never imports resurge, on the local cluster.

The cluster quarantines at a score of 0.9 (one XID that takes a GPU out) and asks a
quarantined node for a health check a second after, once no job runs on it. XID 48 on
the node of replica 0: the job moves off, the check resets the GPU (its XID asked for a
reset), every GPU answers, and the node is released and uncordoned, its score halved.
XID 79 on the node of replica 1: the GPU fell off the bus, the check fails, and the node
stays quarantined and cordoned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from resurge.cluster import open_backend
from resurge.contract.subjects import escape_token
from resurge.control.effects.client import inject_xid
from resurge.control.state.node_health import NodeHealth, NodeHealthStore
from resurge.events import Assign, Event, NodeChecked, RecoveryLevel, RecoveryStarted
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus
from tests.e2e.test_node_quarantine import PLAIN_WORKER, job, record_shows, rendezvous

pytestmark = pytest.mark.e2e


def placed(seen: list[Observed], generation: int) -> dict[int, str]:
    """Where each replica of ``generation`` was assigned."""
    return {o.event.replica or 0: str(o.event.node) for o in seen
            if isinstance(o.event, Assign) and o.event.generation == generation}  # fmt: skip


def moved(generation: int) -> Callable[[list[Observed]], bool]:
    def test(seen: list[Observed]) -> bool:
        return any(isinstance(o.event, RecoveryStarted) and o.event.level is RecoveryLevel.NODE
                   and o.event.to_generation >= generation for o in seen)  # fmt: skip

    return test


async def node_record(bus: Bus, node: str) -> NodeHealth:
    kv = await bus.node_health_bucket(create=False)
    assert kv is not None
    found = await NodeHealthStore(kv).get(node)
    assert found is not None
    return found[0]


def released_by_check(record: NodeHealth) -> bool:
    return record.last_release is not None and record.last_release.by == "health_check"


async def node_shows(bus: Bus, node: str, test: Callable[[NodeHealth], bool]) -> None:
    """Return once ``node``'s health record passes ``test`` (a watch of its KV entry)."""
    kv = await bus.node_health_bucket(create=False)
    assert kv is not None
    watcher = await kv.watch(escape_token(node))
    try:
        async with asyncio.timeout(60):
            async for entry in watcher:
                value = None if entry is None else entry.value
                if value and test(NodeHealth.model_validate_json(value)):
                    return
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]  # nats.py: untyped


async def test_a_clean_health_check_releases_a_quarantined_node_a_failed_one_does_not(
    nats_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESURGE_NODE_QUARANTINE_SCORE", "0.9")
    monkeypatch.setenv("RESURGE_NODE_HEALTH_CHECK_AFTER_SECONDS", "1")
    checks: list[NodeChecked] = []
    answered = asyncio.Event()
    seen: dict[str, object] = {}

    async def break_two_nodes(bus: Bus, watch: Watch) -> None:
        async def checked(event: Event, _subject: str) -> None:
            if isinstance(event, NodeChecked):
                checks.append(event)
                answered.set()

        await bus.subscribe(bus.subjects.raw("_", "node_checked", None), checked)
        await watch.wait_for(lambda s: len(placed(s, 0)) == 2, 90)
        first = placed(watch.observed, 0)[0]
        await inject_xid(bus, first, 0, 48)
        await watch.wait_for(moved(1), 60)
        await node_shows(bus, first, released_by_check)
        seen["first"], seen["first_record"] = first, await node_record(bus, first)
        generation = max(o.event.to_generation for o in watch.observed
                         if isinstance(o.event, RecoveryStarted))  # fmt: skip
        await watch.wait_for(lambda s: len(placed(s, generation)) == 2, 90)
        await record_shows(bus, "hc", rendezvous(generation))  # it trained again
        second = placed(watch.observed, generation)[1]
        await inject_xid(bus, second, 0, 79)
        await watch.wait_for(moved(generation + 1), 60)
        async with asyncio.timeout(60):
            while not any(c.node == second and not c.passed for c in checks):
                await answered.wait()
                answered.clear()
        seen["second"], seen["second_record"] = second, await node_record(bus, second)
        backend = await open_backend(bus, bus.settings)
        seen["cordoned"] = sorted(n.name for n in await backend.list_nodes() if n.cordoned)

    spec = job("hc", PLAIN_WORKER, "--step-seconds", "0.05")
    await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=4,
                  gpus_per_node=1, wait_seconds=240, during=break_two_nodes,
                  end_with_during=True)  # fmt: skip

    first, second = str(seen["first"]), str(seen["second"])
    released = seen["first_record"]
    assert isinstance(released, NodeHealth)
    assert released.quarantine is None and released.last_release is not None
    assert released.last_release.by == "health_check"
    assert "simulated GPU 0 reset" in released.last_release.why
    assert released.score == pytest.approx(0.45)
    kept = seen["second_record"]
    assert isinstance(kept, NodeHealth) and kept.quarantine is not None
    assert seen["cordoned"] == [second] and first != second
    passed = {c.node: c.passed for c in checks}
    assert passed[first] is True and passed[second] is False
    failed = next(c for c in checks if c.node == second)
    assert "GPU(s) 0 still out of use" in failed.message
