"""A recovery of a script that reports no progress ends when its new generation passed
its rendezvous (or a worker of it exited 0: it did its work), not when a worker started:
real nats-server, real job records, the real restarter (its consumers started); the
cluster is :class:`FakeBackend`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from resurge.cluster import NodeInfo
from resurge.control.decisions.worker_groups import worker_groups
from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import (
    Event,
    FaultDetected,
    FaultScope,
    JobPhase,
    ProcessExited,
    ProcessStarted,
    RecoveryFinished,
    RecoveryLevel,
    RecoveryStarted,
    RendezvousPassed,
    Source,
)
from resurge.jobspec import parse_job
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_restarter.service import Restarter
from tests.integration.fake_backend import FakeBackend

JOB = "plain"
AGENT = Source(service="node-agent", instance="n0:1")
T0 = datetime.now(UTC)


def running_job() -> JobRecord:
    spec = parse_job({"metadata": {"name": JOB}, "spec": {"command": ["train"], "nprocPerNode": 2}})
    return JobRecord(
        name=JOB,
        spec=spec,
        phase=JobPhase.RUNNING,
        generation=1,
        rendezvous_generation=1,  # generation 1 trained
        placements=[Placement(replica=0, node="n0"), Placement(replica=1, node="n1")],
    )


def killed(generation: int, rank: int, at: datetime) -> FaultDetected:
    return FaultDetected(
        source=Source(service="detector", instance="d:1"),
        job=JOB,
        generation=generation,
        replica=rank // 2,
        rank=rank,
        fault_id=f"process_exit:{JOB}:g{generation}:r{rank}",
        scope=FaultScope.PROCESS,
        reason="process_killed",
        suggested_level=RecoveryLevel.PROCESS,
        time=at,
    )


def started(generation: int, at: datetime) -> ProcessStarted:
    return ProcessStarted(
        source=AGENT, job=JOB, generation=generation, rank=0, replica=0, node="n0", pid=7,
        local_rank=0, local_world_size=2, time=at,
    )  # fmt: skip


def passed(generation: int, at: datetime) -> RendezvousPassed:
    return RendezvousPassed(
        source=AGENT, job=JOB, generation=generation, replica=0, node="n0", world_size=4, time=at
    )


@pytest.fixture
async def store(bus: Bus) -> JobStore:
    store = JobStore(await bus.jobs_bucket())
    assert await store.create(running_job())
    return store


@pytest.fixture
async def restarter(settings: Settings, bus: Bus, store: JobStore) -> AsyncIterator[Restarter]:
    ctx = ServiceContext("restarter", settings, bus, CollectorRegistry(), AsyncExitStack())
    nodes = [NodeInfo(name=f"n{i}", slots=2) for i in range(2)]
    yield Restarter(ctx, FakeBackend(nodes, worker_groups(running_job())), store, me="r")
    for task in list(ctx.tasks):
        task.cancel()
    for task in list(ctx.tasks):
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await ctx.exit_stack.aclose()


async def record_of(store: JobStore) -> JobRecord:
    found = await store.get(JOB)
    assert found is not None
    return found[0]


async def test_a_worker_start_ends_no_recovery_its_rendezvous_does(
    store: JobStore, restarter: Restarter
) -> None:
    await restarter.on_fault(killed(1, 1, T0))
    await restarter.sign_of_life(started(2, T0 + timedelta(seconds=0.2)))
    record = await record_of(store)
    assert record.pending_recovery is not None and record.phase is JobPhase.RECOVERING
    assert record.alive_since == T0 + timedelta(seconds=0.2)

    await restarter.on_rendezvous(passed(2, T0 + timedelta(seconds=0.7)))
    record = await record_of(store)
    assert record.pending_recovery is None and record.phase is JobPhase.RUNNING
    assert record.last_recovery is not None and record.last_recovery.seconds == 0.7
    assert record.rendezvous_generation == 2


async def test_kills_of_other_ranks_after_each_rendezvous_stay_at_process_level(
    bus: Bus, store: JobStore, restarter: Restarter
) -> None:
    """The restarter's own consumers: rendezvous_passed events from the raw stream end
    each recovery, and the next kill (rank 1, 2, then 3) is a new incident."""
    finished: asyncio.Queue[RecoveryFinished] = asyncio.Queue()
    begun: asyncio.Queue[RecoveryStarted] = asyncio.Queue()

    async def on_action(event: Event, _subject: str) -> None:
        if isinstance(event, RecoveryFinished):
            await finished.put(event)
        if isinstance(event, RecoveryStarted):
            await begun.put(event)

    sub = await bus.subscribe(bus.subjects.action(JOB), on_action)
    await restarter.start()
    now = T0
    for rank in (1, 2, 3):
        generation = (await record_of(store)).generation
        await bus.publish(bus.subjects.fault(JOB, "process"), killed(generation, rank, now))
        assert (await asyncio.wait_for(begun.get(), 30)).to_generation == generation + 1
        start = started(generation + 1, now + timedelta(seconds=0.3))
        await bus.publish(bus.subjects.raw(JOB, "process_started", "n0"), start)
        rendezvous = passed(generation + 1, now + timedelta(seconds=0.6))
        await bus.publish(bus.subjects.raw(JOB, "rendezvous_passed", "n0"), rendezvous)
        done = await asyncio.wait_for(finished.get(), 30)
        assert (done.generation, done.level) == (generation + 1, RecoveryLevel.PROCESS)
        assert done.duration_seconds == pytest.approx(0.6)
        now += timedelta(seconds=4)
    await sub.unsubscribe()
    record = await record_of(store)
    assert record.restarts == {RecoveryLevel.PROCESS: 3} and record.generation == 4


async def test_a_worker_of_the_new_generation_that_exits_0_ends_the_recovery(
    store: JobStore, restarter: Restarter
) -> None:
    """A script that needs no rendezvous and is done at once (examples/crash_once)."""
    await restarter.on_fault(killed(1, 0, T0))
    await restarter.sign_of_life(started(2, T0 + timedelta(seconds=0.2)))
    done = ProcessExited(
        source=AGENT, job=JOB, generation=2, rank=1, replica=0, node="n0", pid=8,
        local_rank=1, local_world_size=2, exit_code=0, time=T0 + timedelta(seconds=0.4),
    )  # fmt: skip
    crashed = done.model_copy(update={"exit_code": 1, "generation": 2})
    await restarter.on_exit(crashed)  # a crash is the detector's to report
    assert (await record_of(store)).pending_recovery is not None
    await restarter.on_exit(done)
    record = await record_of(store)
    assert record.pending_recovery is None and record.phase is JobPhase.RUNNING
    assert record.last_recovery is not None and record.last_recovery.seconds == 0.4
