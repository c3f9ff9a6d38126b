"""The restarter carries each recovery plan out exactly once, across crashes and peers.

Real nats-server, real job records (compare-and-set in JetStream KV), the real
restarter and dispatcher; the cluster is :class:`FakeBackend`, which records every call
(what is tested here is the dispatcher's steps, not a cluster). Commands are counted
as the streams store them: JetStream keeps one copy of each command id, so a command
sent again by a restarter finishing another's plan is stored once.

The job: two replicas on n0 and n1, n2 free. A node fault on n1 makes a `node`
recovery: cordon n1, move replica 1 to n2, Stop generation 1 on both replicas, then
Assign generation 2 to both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Protocol

import nats.js.errors
import pytest
from prometheus_client import CollectorRegistry

from resurge.cluster import BackendError, ClusterBackend, NodeInfo
from resurge.control.planner import command_id
from resurge.control.records import JobRecord, JobStore, Placement
from resurge.control.recovery_policy import ClusterView, apply_fault
from resurge.control.worker_groups import worker_group, worker_groups
from resurge.events import (
    Assign,
    Event,
    FaultDetected,
    FaultScope,
    JobPhase,
    PhaseChanged,
    RecoveryLevel,
    RecoveryStarted,
    Source,
    Stop,
    decode_event,
)
from resurge.jobspec import parse_job
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_restarter.service import Restarter
from tests.integration.fake_backend import WRITES, Call, FakeBackend

JOB = "team.job"
LEASE = 1.0
DETECTOR = Source(service="detector", instance="here:1")
FAULT = FaultDetected(
    source=DETECTOR,
    job=JOB,
    generation=1,
    node="n1",
    fault_id="xid-79@n1",
    scope=FaultScope.NODE,
    reason="xid",
)
REASON = "xid (xid-79@n1)"


RUN = "run-1"  # the job's run: its worker groups and commands name it


def running_job() -> JobRecord:
    spec = parse_job({"metadata": {"name": JOB}, "spec": {"command": ["train"], "nprocPerNode": 2}})
    return JobRecord(
        name=JOB,
        uid=RUN,
        spec=spec,
        phase=JobPhase.RUNNING,
        generation=1,
        placements=[Placement(replica=0, node="n0"), Placement(replica=1, node="n1")],
    )


class RestarterFactory(Protocol):
    """Makes a restarter named ``me`` acting on ``backend`` (the ``restarter`` fixture)."""

    def __call__(self, backend: ClusterBackend, me: str) -> Restarter: ...


@pytest.fixture
async def store(bus: Bus) -> JobStore:
    store = JobStore(await bus.jobs_bucket())
    assert await store.create(running_job())
    return store


@pytest.fixture
def cluster() -> FakeBackend:
    nodes = [NodeInfo(name=f"n{i}", slots=2) for i in range(3)]
    return FakeBackend(nodes, worker_groups(running_job()))


@pytest.fixture
async def contexts(settings: Settings, bus: Bus) -> AsyncIterator[list[ServiceContext]]:
    """Service contexts for restarters; their background tasks are cancelled at the end,
    as the service runner cancels them when a service stops."""
    made: list[ServiceContext] = []
    yield made
    for ctx in made:
        for task in list(ctx.tasks):
            task.cancel()
        for task in list(ctx.tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await ctx.exit_stack.aclose()


@pytest.fixture
def restarter(
    contexts: list[ServiceContext], settings: Settings, bus: Bus, store: JobStore
) -> RestarterFactory:
    def make(backend: ClusterBackend, me: str) -> Restarter:
        ctx = ServiceContext("restarter", settings, bus, CollectorRegistry(), AsyncExitStack())
        contexts.append(ctx)
        return Restarter(ctx, backend, store, me=me, lease_seconds=LEASE)

    return make


async def stored(bus: Bus, family: str, subject: str) -> list[Event]:
    """The events ``family``'s stream holds on ``subject`` (wildcards allowed), in order."""
    events: list[Event] = []
    seq = 1
    while True:
        try:
            msg = await bus.js.get_msg(bus.subjects.stream(family), seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            return events
        assert msg.data is not None and msg.seq is not None
        events.append(decode_event(msg.data))
        seq = msg.seq + 1


async def commands(bus: Bus) -> list[Event]:
    return await stored(bus, "cmd", bus.subjects.cmd(JOB, None))


async def actions(bus: Bus) -> list[Event]:
    return await stored(bus, "action", bus.subjects.action(JOB))


async def record_of(store: JobStore) -> JobRecord:
    found = await store.get(JOB)
    assert found is not None
    return found[0]


async def until_dispatched(store: JobStore, seconds: float = 20) -> JobRecord:
    """The job record once its plan is marked dispatched (watched, not polled)."""
    watcher = await store.kv.watch(store.key(JOB))
    try:
        async with asyncio.timeout(seconds):
            async for entry in watcher:
                if entry is None or not entry.value:
                    continue
                record = JobRecord.model_validate_json(entry.value)
                if record.pending_recovery is not None and record.pending_recovery.dispatched:
                    return record
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    raise AssertionError("the job record watch ended")


def plain(calls: list[Call]) -> list[tuple[str, tuple[object, ...]]]:
    return [(c.method, c.args) for c in calls]


THE_PLAN = [
    ("cordon", ("n1", REASON)),
    ("delete_worker_group", (JOB, 1, "n1")),
    ("create_worker_group", (worker_group(running_job(), Placement(replica=1, node="n2")),)),
]
"""What the node recovery asks of the cluster, once."""


async def assert_carried_out_once(bus: Bus, store: JobStore, cluster: FakeBackend) -> JobRecord:
    """The plan is dispatched, the cluster is as one run leaves it, and each command and
    announcement is stored once, under its derived id."""
    record = await record_of(store)
    assert record.pending_recovery is not None and record.pending_recovery.dispatched
    assert record.generation == 2 and record.phase is JobPhase.RECOVERING
    assert record.placements == [Placement(replica=0, node="n0"), Placement(replica=1, node="n2")]
    assert cluster.nodes["n1"].cordoned and cluster.nodes["n1"].cordon_reason == REASON
    assert not cluster.nodes["n0"].cordoned and not cluster.nodes["n2"].cordoned
    assert set(cluster.groups) == {("n0", JOB, 0), ("n2", JOB, 1)}

    sent = await commands(bus)
    stops = [e for e in sent if isinstance(e, Stop)]
    assigns = [e for e in sent if isinstance(e, Assign)]
    assert len(sent) == len(stops) + len(assigns) == 4
    assert sorted((s.replica, s.generation, s.id) for s in stops) == [
        (r, 1, command_id("stop", JOB, r, 1, record.uid)) for r in (0, 1)
    ]
    assert sorted((a.replica, a.node, a.generation, a.id) for a in assigns) == [
        (0, "n0", 2, command_id("assign", JOB, 0, 2, record.uid)),
        (1, "n2", 2, command_id("assign", JOB, 1, 2, record.uid)),
    ]
    announced = await actions(bus)
    assert [type(e) for e in announced] == [RecoveryStarted, PhaseChanged]
    started = announced[0]
    assert isinstance(started, RecoveryStarted)
    assert (started.level, started.from_generation, started.to_generation) == (
        RecoveryLevel.NODE,
        1,
        2,
    )
    return record


async def test_the_fake_is_a_cluster_backend(cluster: FakeBackend) -> None:
    assert isinstance(cluster, ClusterBackend)


async def test_a_plan_is_carried_out_once(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory
) -> None:
    first = restarter(cluster, "restarter-a")
    await first.on_fault(FAULT)
    assert plain(cluster.writes()) == THE_PLAN
    record = await assert_carried_out_once(bus, store, cluster)
    assert record.pending_recovery is not None
    assert record.pending_recovery.claimed_by == "restarter-a"

    # The fault delivered again, and a second restarter starting up: nothing new.
    await first.on_fault(FAULT)
    await restarter(cluster, "restarter-b").resume_unfinished()
    assert plain(cluster.writes()) == THE_PLAN
    assert await record_of(store) == record
    await assert_carried_out_once(bus, store, cluster)


@pytest.mark.parametrize("broken", ["cordon", "delete_worker_group", "create_worker_group"])
async def test_a_redelivered_fault_finishes_a_plan_stopped_part_way(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory, broken: str
) -> None:
    first = restarter(cluster, "restarter-a")
    cluster.fail(broken)
    with pytest.raises(BackendError):
        await first.on_fault(FAULT)
    done = [c for c in cluster.writes() if not c.failed]
    assert plain(done) == THE_PLAN[: [m for m, _ in THE_PLAN].index(broken)]
    record = await record_of(store)
    assert record.pending_recovery is not None and not record.pending_recovery.dispatched
    assert [e for e in await commands(bus) if isinstance(e, Assign)] == []

    await first.on_fault(FAULT)  # the bus redelivers a fault whose handler raised

    # Each step is done again from the first; repeating what had been done changes nothing.
    again = [c for c in cluster.writes() if not c.failed][len(done) :]
    assert plain(again) == THE_PLAN
    await assert_carried_out_once(bus, store, cluster)


async def test_two_restarters_finish_a_lapsed_plan_once(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory
) -> None:
    """A restarter wrote its plan and died before carrying out any of it; its claim has
    lapsed. Two restarters look at it at once: the claim (compare-and-set) lets one."""
    view = await cluster.live_nodes()

    def decide(r: JobRecord) -> bool:
        apply_fault(
            r,
            FAULT,
            now=datetime.now(UTC),
            cluster=ClusterView(nodes=view),
            claimant="restarter-gone",
            lease_seconds=0.0,
        )
        return True

    await store.mutate(JOB, decide)
    cluster.calls.clear()
    record = await record_of(store)

    a, b = restarter(cluster, "restarter-a"), restarter(cluster, "restarter-b")
    await asyncio.gather(a.take_over(record), b.take_over(record))

    assert plain(cluster.writes()) == THE_PLAN
    finished = await assert_carried_out_once(bus, store, cluster)
    assert finished.pending_recovery is not None
    assert finished.pending_recovery.claimed_by in {"restarter-a", "restarter-b"}


async def test_a_claim_held_by_a_live_restarter_is_not_taken_before_it_lapses(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory
) -> None:
    first = restarter(cluster, "restarter-a")
    cluster.fail("create_worker_group")
    with pytest.raises(BackendError):
        await first.on_fault(FAULT)  # restarter-a stops part-way and holds its claim
    held = await record_of(store)
    plan = held.pending_recovery
    assert plan is not None and plan.claimed_by == "restarter-a"
    assert plan.claimed_until is not None and datetime.now(UTC) < plan.claimed_until
    calls_before = len(cluster.calls)

    second = restarter(cluster, "restarter-b")
    await second.resume_unfinished()
    assert len(cluster.calls) == calls_before  # asked nothing of the cluster
    assert await record_of(store) == held  # and claimed nothing

    finished = await until_dispatched(store)
    assert finished.pending_recovery is not None
    assert finished.pending_recovery.claimed_by == "restarter-b"
    taken_over = cluster.calls[calls_before:]
    assert taken_over and all(c.at >= plan.claimed_until for c in taken_over)
    assert plain([c for c in taken_over if c.method in WRITES]) == THE_PLAN
    await assert_carried_out_once(bus, store, cluster)


async def test_a_process_restart_goes_out_in_one_window_in_order(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory
) -> None:
    crash = FaultDetected(
        source=DETECTOR,
        job=JOB,
        generation=1,
        rank=1,
        node="n0",
        fault_id="process_exit:team.job:g1:r1",
        scope=FaultScope.PROCESS,
        reason="process_crash",
    )
    await restarter(cluster, "restarter-a").on_fault(crash)
    assert cluster.writes() == []  # nothing to change in the cluster
    record = await record_of(store)
    assert record.pending_recovery is not None and record.pending_recovery.dispatched
    sent = await commands(bus)
    # Each replica's Stop of the failed generation is stored before its Assign.
    for replica in (0, 1):
        mine = [(type(e), e.generation) for e in sent if e.replica == replica]
        assert mine == [(Stop, 1), (Assign, 2)]
    announced = await actions(bus)
    assert [type(e) for e in announced] == [RecoveryStarted, PhaseChanged]
    assert isinstance(announced[0], RecoveryStarted)
    assert announced[0].level is RecoveryLevel.PROCESS
