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
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from functools import partial
from typing import Protocol

import nats.js.errors
import pytest
from prometheus_client import CollectorRegistry

from resurge.cluster import BackendError, ClusterBackend, NodeInfo
from resurge.control.decisions.elastic_decision import Kind, Resize
from resurge.control.decisions.planner import command_id
from resurge.control.decisions.recovery_policy import ClusterView, apply_fault
from resurge.control.decisions.worker_groups import worker_group, worker_groups
from resurge.control.state.records import JobRecord, JobStore, Placement, RestartEntry
from resurge.events import (
    Assign,
    Event,
    FaultDetected,
    FaultScope,
    JobPhase,
    PhaseChanged,
    RecoveryLevel,
    RecoveryStarted,
    ReplicaFinished,
    Source,
    Stop,
    decode_event,
)
from resurge.jobspec import parse_job
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_restarter.service import Restarter
from resurge_scaler.resize_plan import apply_resize
from resurge_scaler.service import Scaler
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
                record = JobRecord.from_entry(entry.value)
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


async def test_a_process_restart_is_one_command_per_replica_in_one_window(
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
    # Nothing happens between the stop and the start: each replica gets one command, an
    # Assign of the next generation that stops the failed one first.
    for replica in (0, 1):
        mine = [e for e in sent if e.replica == replica]
        assert [(type(e), e.generation) for e in mine] == [(Assign, 2)]
        assert isinstance(mine[0], Assign) and mine[0].stop is not None
        assert (mine[0].stop.generation, mine[0].stop.graceful) == (1, True)
    announced = await actions(bus)
    assert [type(e) for e in announced] == [RecoveryStarted, PhaseChanged]
    assert isinstance(announced[0], RecoveryStarted)
    assert announced[0].level is RecoveryLevel.PROCESS


# -- what the record still owes is finished from the record ------------------------------

CRASH = FaultDetected(
    source=DETECTOR,
    job=JOB,
    generation=1,
    rank=1,
    replica=0,
    node="n0",
    fault_id="process_exit:team.job:g1:r1",
    scope=FaultScope.PROCESS,
    reason="process_crash",
)


async def until(
    store: JobStore, test: Callable[[JobRecord], bool], seconds: float = 10
) -> JobRecord:
    """The job record once ``test`` holds for it (watched, not polled)."""
    watcher = await store.kv.watch(store.key(JOB))
    try:
        async with asyncio.timeout(seconds):
            async for entry in watcher:
                if entry is None or not entry.value:
                    continue
                record = JobRecord.from_entry(entry.value)
                if test(record):
                    return record
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    raise AssertionError("the job record watch ended")


def dispatched_to(generation: int) -> Callable[[JobRecord], bool]:
    def test(record: JobRecord) -> bool:
        plan = record.pending_recovery
        return plan is not None and plan.to_generation == generation and plan.dispatched

    return test


async def test_a_plan_whose_carry_out_failed_every_delivery_is_finished_later(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory
) -> None:
    """The cluster refuses every cordon for longer than the bus redelivers the fault
    (each of its max_deliver deliveries fails): once the cluster answers again, the
    restarter that decided finishes the plan from the record by itself, with no fault
    delivered again and no restart."""
    first = restarter(cluster, "restarter-a")
    await first.start()
    cluster.down("cordon")
    for _ in range(10):  # every delivery the fault consumer makes (max_deliver)
        with pytest.raises(BackendError):
            await first.on_fault(FAULT)
    record = await record_of(store)
    assert record.pending_recovery is not None and not record.pending_recovery.dispatched
    cluster.up("cordon")
    await until(store, dispatched_to(2))
    await assert_carried_out_once(bus, store, cluster)


def fails_at_once(record: JobRecord) -> bool:
    """Make the job fail at its next fault (``jobMaxRetryCount: 0``)."""
    recovery = record.spec.spec.recovery.model_copy(update={"max_restarts": 0})
    spec = record.spec.spec.model_copy(update={"recovery": recovery})
    record.spec = record.spec.model_copy(update={"spec": spec})
    return True


@pytest.mark.parametrize("broken", ["cmd stream", "action stream", "delete_worker_group"])
async def test_a_failed_job_whose_last_steps_failed_is_finished_later(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory, broken: str
) -> None:
    """The decision to fail is written; then its final Stops, its phase announcement or
    the release of its worker groups fail (a stream gone, the cluster unreachable). The
    redelivered fault changes nothing (the job is Failed already), yet the workers get
    their final Stop, the phase is announced and the worker groups are deleted, once
    each, with no new event."""
    await store.mutate(JOB, fails_at_once)
    first = restarter(cluster, "restarter-a")
    await first.start()
    if broken == "delete_worker_group":
        cluster.down(broken)
    else:
        await bus.js.delete_stream(bus.subjects.stream(broken.split()[0]))
    with contextlib.suppress(Exception):
        await first.on_fault(CRASH)
    assert (await record_of(store)).phase is JobPhase.FAILED
    with contextlib.suppress(Exception):
        await first.on_fault(CRASH)  # delivered again: the job is Failed, nothing to decide
    if broken == "delete_worker_group":
        cluster.up(broken)
    else:
        await bus.ensure_streams()

    await cluster.wait_for(lambda _: not [g for g in cluster.groups.values() if g.job == JOB])
    ended = await until(store, lambda r: r.ending is not None and r.ending.done)
    assert ended.phase is JobPhase.FAILED
    stops = [e for e in await commands(bus) if isinstance(e, Stop)]
    assert sorted((s.replica, s.generation, s.final, s.id) for s in stops) == [
        (r, 1, True, command_id("stop-final", JOB, r, 1, RUN)) for r in (0, 1)
    ]
    phases = [e for e in await actions(bus) if isinstance(e, PhaseChanged)]
    assert [(p.previous, p.phase) for p in phases] == [(JobPhase.RUNNING, JobPhase.FAILED)]


async def test_a_failed_job_ends_at_once_when_nothing_fails(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory
) -> None:
    """The restarter that decided to fail the job does its last steps itself, in order:
    the final Stops, then the phase, then the worker groups deleted; each marked done."""
    await store.mutate(JOB, fails_at_once)
    await restarter(cluster, "restarter-a").on_fault(CRASH)
    assert [type(e) for e in await commands(bus)] == [Stop, Stop]
    assert [c.method for c in cluster.writes()] == ["delete_worker_group"] * 2
    assert not [g for g in cluster.groups.values() if g.job == JOB]
    ended = await record_of(store)
    assert ended.phase is JobPhase.FAILED and ended.ending is not None and ended.ending.done


def repeating_crash(record: JobRecord) -> bool:
    """Generation 1 was started by a restart for the same crash and did not train: the
    next crash of rank 1 is that restart's second, after a backoff (1 s by default)."""
    record.history = [
        RestartEntry(
            time=datetime.now(UTC),
            level=RecoveryLevel.PROCESS,
            signature="process_crash@rank1",
            to_generation=1,
        )
    ]
    return True


async def test_a_plan_superseded_in_its_backoff_is_not_sent(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory
) -> None:
    """A repeated crash is restarted after a backoff; meanwhile a node fault writes a
    new plan (generation 3, replica 1 moved off n1), carried out at once. When the
    first plan's backoff ends, its timer sends nothing: no Assign of generation 2 goes
    to the placements that plan was decided on."""
    await store.mutate(JOB, repeating_crash)
    first = restarter(cluster, "restarter-a")
    await first.on_fault(CRASH)
    waiting = await record_of(store)
    assert waiting.pending_recovery is not None and not waiting.pending_recovery.dispatched
    assert waiting.pending_recovery.start_at > datetime.now(UTC)  # in its backoff

    await first.on_fault(FAULT.model_copy(update={"generation": None}))
    record = await record_of(store)
    assert dispatched_to(3)(record)
    assert record.placements == [Placement(replica=0, node="n0"), Placement(replica=1, node="n2")]

    await asyncio.wait(list(first.ctx.tasks))  # the first plan's backoff ran out
    assigns = [e for e in await commands(bus) if isinstance(e, Assign)]
    assert sorted((a.replica, a.node, a.generation) for a in assigns) == [
        (0, "n0", 3),
        (1, "n2", 3),
    ]
    assert dispatched_to(3)(await record_of(store))


async def test_a_resize_overwritten_by_a_fault_keeps_its_stops(
    bus: Bus, store: JobStore, restarter: RestarterFactory
) -> None:
    """The scaler wrote a shrink 3 -> 2 (replica 2 on n2 goes); before any restarter
    carried it out, a node fault on n1 writes a new plan over it. The replica the shrink
    removed still gets its Stop and its worker group is deleted; no Assign reaches it."""

    def three_replicas(record: JobRecord) -> bool:
        record.placements = [*record.placements, Placement(replica=2, node="n2")]
        return True

    await store.mutate(JOB, three_replicas)
    three = await record_of(store)
    nodes = [NodeInfo(name=f"n{i}", slots=2) for i in range(4)]
    cluster = FakeBackend(nodes, worker_groups(three))
    shrink = Resize(
        job=JOB,
        kind=Kind.SHRINK,
        from_replicas=3,
        to_replicas=2,
        why="room for a higher-priority job",
        remove=(2,),
        nodes=("n0", "n1"),
    )
    write = partial(apply_resize, resize=shrink, generation=1, addresses={}, now=datetime.now(UTC))
    await store.mutate(JOB, write)
    resized = await record_of(store)
    assert resized.phase is JobPhase.RESIZING and resized.generation == 2

    await restarter(cluster, "restarter-a").on_fault(FAULT.model_copy(update={"generation": None}))
    record = await record_of(store)
    assert dispatched_to(3)(record)
    assert {p.replica for p in record.placements} == {0, 1}

    sent = await commands(bus)
    assert [(e.replica, e.generation) for e in sent if isinstance(e, Stop) and e.replica == 2] == [
        (2, 2)
    ]
    assert sorted((e.replica or 0, e.generation) for e in sent if isinstance(e, Assign)) == [
        (0, 3),
        (1, 3),
    ]
    assert ("n2", JOB, 2) not in cluster.groups
    assert {(g.node, g.replica) for g in cluster.groups.values()} == {("n0", 0), ("n2", 1)}


async def test_a_succeeded_job_the_scaler_left_part_way_is_finished_by_a_restarter(
    bus: Bus, store: JobStore, cluster: FakeBackend, restarter: RestarterFactory
) -> None:
    """The scaler marks the job Succeeded with its last replica, sends the final Stops
    and the phase, and fails to delete the worker groups (the cluster unreachable). A
    restarter, watching the records, deletes them once the scaler's claim lapsed."""
    ctx = ServiceContext("scaler", bus.settings, bus, CollectorRegistry(), AsyncExitStack())
    scaler = Scaler(ctx, store, cluster)
    await restarter(cluster, "restarter-a").start()
    agent = Source(service="node-agent", instance="n0:1")
    await scaler.on_finished(ReplicaFinished(source=agent, job=JOB, replica=0, generation=1))
    cluster.down("delete_worker_group")
    with pytest.raises(BackendError):
        await scaler.on_finished(ReplicaFinished(source=agent, job=JOB, replica=1, generation=1))
    left = await record_of(store)
    assert left.phase is JobPhase.SUCCEEDED and left.ending is not None
    assert (left.ending.stopped, left.ending.announced, left.ending.released) == (
        True,
        True,
        False,
    )
    cluster.up("delete_worker_group")

    ended = await until(store, lambda r: r.ending is not None and r.ending.done)
    assert ended.ending is not None and ended.ending.claimed_by == "restarter-a"
    assert not [g for g in cluster.groups.values() if g.job == JOB]
    stops = [e for e in await commands(bus) if isinstance(e, Stop)]
    assert sorted((s.replica, s.final) for s in stops) == [(0, True), (1, True)]
    phases = [e for e in await actions(bus) if isinstance(e, PhaseChanged)]
    assert [p.phase for p in phases] == [JobPhase.SUCCEEDED]
