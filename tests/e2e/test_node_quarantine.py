"""A node that keeps failing, across two jobs, is quarantined and both jobs move off it:
real torch (gloo) workers on the local cluster, one job under ``resurge.worker``, the
other a plain torch.distributed script that never imports resurge.

The node's simulated GPU raises XID 94 (a contained uncorrectable memory error: the
application restarts, the memory is suspect) three times. Each is a process restart of
both jobs on the node and adds 0.5 to the node's score, once (one cause, two jobs); the
third takes it past the cluster's threshold (set to 1.4 here), and the restarter cordons
the node and moves both jobs' replicas off it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from resurge.cluster import open_backend
from resurge.control.decisions.node_score import INCIDENT_SECONDS
from resurge.control.effects.client import inject_xid, submit_job
from resurge.control.state.node_health import NodeHealthStore
from resurge.control.state.records import JobRecord, JobStore
from resurge.events import Assign, Progress, RecoveryLevel, RecoveryStarted
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import python_job
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus

WORKERS = Path(__file__).parent / "workers"
RESURGE_WORKER = str(WORKERS / "torch_worker.py")
PLAIN_WORKER = str(WORKERS / "plain_ddp_worker.py")
RECOVERY = {"stopGraceSeconds": 2, "evalPeriodSeconds": 2}  # each XID its own incident

pytestmark = pytest.mark.e2e

Seen = Callable[[list[Observed]], bool]


def job(name: str, script: str, *args: str) -> TrainingJob:
    return python_job(
        name, script, *args, nproc=1, replicas=2, preload=["torch", "torch.distributed"],
        env={"OMP_NUM_THREADS": "1"}, recovery=RECOVERY,
    )  # fmt: skip


def started(job: str, generation: int, reason: str | None = None) -> Seen:
    def test(seen: list[Observed]) -> bool:
        return any(
            isinstance(o.event, RecoveryStarted) and o.event.job == job
            and o.event.to_generation >= generation
            and (reason is None or o.event.reason == reason)
            for o in seen
        )  # fmt: skip

    return test


def stepped(generation: int) -> Seen:
    def test(seen: list[Observed]) -> bool:
        return any(
            isinstance(o.event, Progress) and o.event.job == "qa"
            and (o.event.generation or 0) >= generation and o.event.step >= 2
            for o in seen
        )  # fmt: skip

    return test


def assigned(job: str) -> Seen:
    def test(seen: list[Observed]) -> bool:
        return len({o.event.replica for o in seen if isinstance(o.event, Assign)
                    and o.event.job == job and o.event.generation == 0}) == 2  # fmt: skip

    return test


def rendezvous(generation: int) -> Callable[[JobRecord], bool]:
    """Whether a record's ranks of ``generation`` (or a newer one) passed their rendezvous."""
    return lambda record: (record.rendezvous_generation or 0) >= generation


async def record_shows(bus: Bus, name: str, test: Callable[[JobRecord], bool]) -> None:
    """Return once job ``name``'s record passes ``test`` (a watch of its KV entry)."""
    store = JobStore(await bus.jobs_bucket())
    watcher = await store.kv.watch(store.key(name))
    try:
        async with asyncio.timeout(60):
            async for entry in watcher:
                if entry is not None and entry.value and test(JobRecord.from_entry(entry.value)):
                    return
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]  # nats.py: untyped


async def test_a_node_failing_across_two_jobs_is_quarantined_and_both_move_off(
    nats_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESURGE_NODE_QUARANTINE_SCORE", "1.4")
    seen: dict[str, object] = {}

    async def fail_one_node(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(stepped(0), 90)
        await submit_job(bus, job("qb", PLAIN_WORKER, "--step-seconds", "0.05"))
        await watch.wait_for(assigned("qb"), 60)
        nodes = {
            name: {o.event.node for o in watch.observed if isinstance(o.event, Assign)
                   and o.event.job == name and o.event.generation == 0}
            for name in ("qa", "qb")
        }  # fmt: skip
        shared = nodes["qa"] & nodes["qb"]
        assert len(shared) == 1, f"the jobs were placed {nodes}: no node holds both"
        bad = str(shared.pop())
        seen["bad"] = bad
        last = 0.0
        for n in (1, 2, 3):
            await asyncio.sleep(max(0.0, last + INCIDENT_SECONDS + 1 - time.monotonic()))
            last = time.monotonic()
            await inject_xid(bus, bad, 0, 94)
            await watch.wait_for(started("qa", n), 60)
            await watch.wait_for(started("qb", n), 60)
            if n < 3:  # both trained again: the next XID is a new incident for each
                await watch.wait_for(stepped(n), 60)
                await record_shows(bus, "qb", rendezvous(n))
        await watch.wait_for(started("qa", 4, "node_quarantined"), 90)
        await watch.wait_for(started("qb", 4, "node_quarantined"), 90)
        jobs = JobStore(await bus.jobs_bucket())
        for name in ("qa", "qb"):
            found = await jobs.get(name)
            assert found is not None
            seen[name] = {p.node for p in found[0].placements}
        await watch.wait_for(stepped(4), 90)
        backend = await open_backend(bus, bus.settings)
        seen["cordoned"] = {
            n.name: n.cordon_reason for n in await backend.list_nodes() if n.cordoned
        }
        kv = await bus.node_health_bucket(create=False)
        assert kv is not None
        seen["health"] = await NodeHealthStore(kv).get(bad)

    spec = job("qa", RESURGE_WORKER, "--steps", "100000", "--step-seconds", "0.05")
    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=3, gpus_per_node=2, wait_seconds=300, during=fail_one_node,
                           end_with_during=True)  # fmt: skip

    bad = seen["bad"]
    moves = [e for e in result.events(RecoveryStarted) if e.reason == "node_quarantined"]
    assert sorted((e.job, e.level) for e in moves) == [
        ("qa", RecoveryLevel.NODE),
        ("qb", RecoveryLevel.NODE),
    ]
    xids = [e for e in result.events(RecoveryStarted) if e.reason == "gpu_xid"]
    # Each XID restarted both jobs on the node (the ladder may climb to a pod restart
    # when the same fault comes back before a job regained its furthest step); only the
    # quarantine moved them.
    assert len(xids) == 6 and {e.level for e in xids} <= {RecoveryLevel.PROCESS, RecoveryLevel.POD}
    for name in ("qa", "qb"):
        placed = seen[name]
        assert isinstance(placed, set) and bad not in placed
    cordoned = seen["cordoned"]
    assert isinstance(cordoned, dict) and list(cordoned) == [bad]
    assert "quarantined" in cordoned[bad]
    health = seen["health"]
    assert isinstance(health, tuple)
    record = health[0]
    assert record.quarantine is not None and sorted(record.quarantine.jobs) == ["qa", "qb"]
    assert record.counted == 3
    assert [i.rule for i in record.incidents] == ["xid_contained_memory_error"] * 3
