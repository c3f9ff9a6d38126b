"""A node that keeps failing, across two jobs, is quarantined and both jobs move off it:
real torch (gloo) workers on the local cluster, one job under ``resurge.worker``, the
other a plain torch.distributed script that never imports resurge.

The node's simulated GPU raises XID 48 (a double-bit ECC error: the GPU must be reset)
three times. Each time both jobs on the node stop their workers, the node's monitor
resets the GPU (asked once per job: the second finds it reset already) and the workers
start again where they were, and the node's score grows by 1, once (one cause, two
jobs). The third takes it past the cluster's default threshold (2.5), and the restarter
cordons the node and moves both jobs' replicas off it.
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
from resurge.events import (
    Assign,
    Event,
    GpuReset,
    Progress,
    RecoveryLevel,
    RecoveryStarted,
    ResetGpu,
)
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


def moved_off(job: str) -> Seen:
    """Job ``job`` left its node: a ``node`` restart, by the quarantine or, where the
    node was cordoned before the job's own decision on the third XID, by that XID."""

    def test(seen: list[Observed]) -> bool:
        return any(
            isinstance(o.event, RecoveryStarted) and o.event.job == job
            and o.event.level is RecoveryLevel.NODE
            for o in seen
        )  # fmt: skip

    return test


def furthest(seen: list[Observed], generation: int) -> int:
    """The furthest step job qa's generation ``generation`` reported (-1: none)."""
    steps = [o.event.step for o in seen if isinstance(o.event, Progress)
             and o.event.job == "qa" and o.event.generation == generation]  # fmt: skip
    return max(steps, default=-1)


def stepped(generation: int) -> Seen:
    """Job qa's ``generation`` (or a newer one) trained, past the furthest step of the
    generation before it: the restart fixed what it was for, so the next XID is a new
    incident, not the same fault again."""

    def test(seen: list[Observed]) -> bool:
        newest = max((o.event.generation or 0 for o in seen if isinstance(o.event, Progress)
                      and o.event.job == "qa"), default=-1)  # fmt: skip
        if newest < generation:
            return False
        return furthest(seen, newest) >= max(2, furthest(seen, newest - 1) + 1)

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
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    seen: dict[str, object] = {}
    answers: list[GpuReset] = []

    async def fail_one_node(bus: Bus, watch: Watch) -> None:
        async def answer(event: Event, _subject: str) -> None:
            if isinstance(event, GpuReset):
                answers.append(event)

        await bus.subscribe(bus.subjects.raw("_", "gpu_reset", None), answer)
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
            await inject_xid(bus, bad, 0, 48)
            await watch.wait_for(started("qa", n), 60)
            await watch.wait_for(started("qb", n), 60)
            if n < 3:  # both trained again: the next XID is a new incident for each
                await watch.wait_for(stepped(n), 60)
                await record_shows(bus, "qb", rendezvous(n))
        await watch.wait_for(moved_off("qa"), 90)
        await watch.wait_for(moved_off("qb"), 90)
        jobs = JobStore(await bus.jobs_bucket())
        for name in ("qa", "qb"):
            found = await jobs.get(name)
            assert found is not None
            seen[name] = {p.node for p in found[0].placements}
        moved = max(o.event.to_generation for o in watch.observed
                    if isinstance(o.event, RecoveryStarted) and o.event.job == "qa")  # fmt: skip
        await watch.wait_for(stepped(moved), 90)  # qa trains again elsewhere
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
    restarts = [(e.job, e.to_generation, e.reason, e.level) for e in result.events(RecoveryStarted)]
    # The first two XIDs restarted both jobs where they were, after a reset of the GPU.
    in_place = [r for r in restarts if r[1] <= 2]
    assert sorted(in_place) == [(j, g, "gpu_xid", RecoveryLevel.PROCESS)
                                for j in ("qa", "qb") for g in (1, 2)]  # fmt: skip
    # The third quarantined the node: each job moved off it once, by the quarantine (or
    # by the XID itself where the cordon came before the job's own decision).
    moves = [r for r in restarts if r[3] is RecoveryLevel.NODE]
    assert sorted(str(r[0]) for r in moves) == ["qa", "qb"]
    assert {r[2] for r in moves} <= {"node_quarantined", "gpu_xid"}
    asked = [e for e in result.events(ResetGpu) if e.node == bad]
    assert len(asked) >= 4 and {tuple(e.gpus) for e in asked} == {(0,)}
    assert {e.job for e in asked} == {"qa", "qb"}
    done = [a for a in answers if a.node == bad and a.reset]
    assert len(done) >= 2 and all(a.ok for a in answers)
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
    assert [i.rule for i in record.incidents] == ["xid_takes_gpu_out"] * 3
