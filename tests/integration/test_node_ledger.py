"""The restarter's node ledger against a real nats-server: faults of two jobs counted
against one node, its quarantine (cordon, jobs moved off at their next checkpoint), a
dry run, and a job's own errors counting nothing. The cluster is :class:`FakeBackend`
(the ledger's cluster effect is one cordon); the move is the restarter's fault path,
here a queue the test reads (the restarter's own tests cover what it does with it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from resurge.cluster import NodeInfo, Taint
from resurge.control.decisions.node_score import NodePolicy
from resurge.control.effects.node_drain import drain_node
from resurge.control.state.node_health import NodeHealthStore
from resurge.control.state.records import CheckpointRef, JobRecord, JobStore, Placement
from resurge.events import CheckpointNow, FaultDetected, FaultScope, JobPhase, Source
from resurge.jobspec import parse_job
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_restarter.node_evictions import EvictionWatch
from resurge_restarter.node_ledger import QUARANTINE_REASON, NodeLedger
from tests.integration.fake_backend import FakeBackend

DETECTOR = Source(service="detector", instance="d")
WAIT = 20.0


def running(name: str, nodes: list[str], *, checkpoints: bool = False) -> JobRecord:
    spec = parse_job({"metadata": {"name": name}, "spec": {"command": ["train"]}})
    return JobRecord(
        name=name,
        spec=spec,
        phase=JobPhase.RUNNING,
        generation=2,
        placements=[Placement(replica=r, node=n) for r, n in enumerate(nodes)],
        reports_progress=checkpoints,
        latest_checkpoint=CheckpointRef(step=100, path="/c/100") if checkpoints else None,
    )


def xid48(job: str, seconds: float, node: str = "n1") -> FaultDetected:
    """XID 48 on ``node``, as the GPU health detector reports it to ``job``."""
    return FaultDetected(
        source=DETECTOR,
        time=datetime.now(UTC) + timedelta(seconds=seconds),
        fault_id=f"gpu:{node}:0:48:e{seconds}",
        scope=FaultScope.NODE,
        reason="gpu_xid",
        evidence={"node": node, "xid": 48, "action": "reset_gpu"},
        job=job,
        node=node,
        generation=2,
    )


class Ledger:
    """A ledger, its stores and cluster, and the moves it asked for."""

    def __init__(self, ledger: NodeLedger, backend: FakeBackend, jobs: JobStore) -> None:
        self.ledger, self.backend, self.jobs = ledger, backend, jobs
        self.moves: asyncio.Queue[FaultDetected] = asyncio.Queue()

    def cordons(self) -> list[tuple[str, str]]:
        return [(c.args[0], c.args[1]) for c in self.backend.calls if c.method == "cordon"]


@contextlib.asynccontextmanager
async def ledger_of(
    bus: Bus, settings: Settings, records: list[JobRecord], policy: NodePolicy
) -> AsyncIterator[Ledger]:
    jobs = JobStore(await bus.jobs_bucket())
    for record in records:
        assert await jobs.create(record)
    kv = await bus.node_health_bucket()
    assert kv is not None
    ctx = ServiceContext("restarter", settings, bus, CollectorRegistry(), AsyncExitStack())
    backend = FakeBackend([NodeInfo(name=f"n{i}", slots=8) for i in range(1, 4)])
    moves: asyncio.Queue[FaultDetected] = asyncio.Queue()

    async def move(fault: FaultDetected) -> None:
        moves.put_nowait(fault)

    made = Ledger(NodeLedger(ctx, backend, NodeHealthStore(kv), jobs, move, policy), backend, jobs)
    made.moves = moves
    try:
        yield made
    finally:
        for task in list(ctx.tasks):
            task.cancel()
        for task in list(ctx.tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await ctx.exit_stack.aclose()


async def test_three_xid_48_across_two_jobs_quarantine_the_node_and_move_both(
    bus: Bus, settings: Settings
) -> None:
    jobs = [running("a", ["n1", "n2"]), running("b", ["n3", "n1"])]
    async with ledger_of(bus, settings, jobs, NodePolicy()) as made:
        await made.ledger.on_fault(xid48("a", 0))
        await made.ledger.on_fault(xid48("b", 0.001, "n1"))  # the same cause: one incident
        await made.ledger.on_fault(xid48("b", 60))
        assert made.cordons() == [] and made.moves.empty()
        await made.ledger.on_fault(xid48("a", 120))

        record = await made.ledger.nodes.get("n1")
        assert record is not None
        held = record[0].quarantine
        assert held is not None and not held.dry_run and held.jobs == ["a", "b"]
        assert record[0].counted == 3
        [(node, reason)] = made.cordons()
        assert node == "n1" and "quarantined" in reason and "xid_takes_gpu_out" in reason
        moved = [await asyncio.wait_for(made.moves.get(), WAIT) for _ in range(2)]
        assert sorted((m.job, m.node, m.reason, m.replica) for m in moved) == [
            ("a", "n1", QUARANTINE_REASON, 0),
            ("b", "n1", QUARANTINE_REASON, 1),
        ]
        assert all(m.scope is FaultScope.NODE for m in moved)
        registry = made.ledger.ctx.registry
        assert registry.get_sample_value("resurge_node_quarantined", {"node": "n1"}) == 1.0
        score = registry.get_sample_value("resurge_node_score", {"node": "n1"})
        assert score is not None and 2.9 < score <= 3.0
        counted = {"rule": "xid_takes_gpu_out"}
        assert registry.get_sample_value("resurge_node_faults_counted_total", counted) == 3.0


async def test_a_job_that_checkpoints_moves_after_its_next_checkpoint(
    bus: Bus, settings: Settings
) -> None:
    asked: asyncio.Queue[CheckpointNow] = asyncio.Queue()

    async def on_command(event: object, _subject: str) -> None:
        if isinstance(event, CheckpointNow):
            asked.put_nowait(event)

    await bus.subscribe(bus.subjects.cmd("c", 0), on_command)
    async with ledger_of(
        bus, settings, [running("c", ["n1"], checkpoints=True)], NodePolicy(threshold=1.0)
    ) as made:
        await made.ledger.on_fault(xid48("c", 0))
        request = await asyncio.wait_for(asked.get(), WAIT)
        assert request.generation == 2 and "node n1 is quarantined" in request.reason
        assert made.moves.empty()  # it waits for the checkpoint

        def saved(record: JobRecord) -> bool:
            record.latest_checkpoint = CheckpointRef(step=130, path="/c/130")
            return True

        await made.jobs.mutate("c", saved)  # every rank saved step 130, as counted
        moved = await asyncio.wait_for(made.moves.get(), WAIT)
        assert (moved.job, moved.reason) == ("c", QUARANTINE_REASON)


async def test_a_dry_run_reports_and_does_nothing(bus: Bus, settings: Settings) -> None:
    async with ledger_of(
        bus, settings, [running("d", ["n1"])], NodePolicy(mode="dry-run", threshold=1.0)
    ) as made:
        await made.ledger.on_fault(xid48("d", 0))
        record = await made.ledger.nodes.get("n1")
        assert record is not None and record[0].quarantine is not None
        assert record[0].quarantine.dry_run
        assert record[0].quarantine.jobs == []  # enforced, the jobs told to move are noted
        assert made.cordons() == []
        assert made.moves.empty()


async def test_a_job_s_own_crash_counts_nothing_against_the_node(
    bus: Bus, settings: Settings
) -> None:
    async with ledger_of(bus, settings, [running("e", ["n1"])], NodePolicy(threshold=0.1)) as made:
        crash = FaultDetected(
            source=DETECTOR,
            fault_id="process_exit:e:g2:r0",
            scope=FaultScope.PROCESS,
            reason="process_crash",
            evidence={"exit_code": 1, "last_output": "ZeroDivisionError: division by zero"},
            job="e",
            node="n1",
            generation=2,
        )
        await made.ledger.on_fault(crash)
        assert await made.ledger.nodes.get("n1") is None
        assert made.cordons() == []


async def test_a_drain_checkpoints_the_jobs_on_the_node_then_moves_them_and_says_so(
    bus: Bus, settings: Settings
) -> None:
    """``resurge node drain``'s path: the drain asked in the node's record, the ledger's
    watch taking it up; one job checkpoints first (its count is made here, as the
    restarter's would be on its ranks' reports), the other reports none."""
    jobs = [running("f", ["n1", "n2"], checkpoints=True), running("g", ["n1"])]
    async with ledger_of(bus, settings, jobs, NodePolicy()) as made:

        async def count_the_checkpoint(event: object, _subject: str) -> None:
            if isinstance(event, CheckpointNow):

                def saved(record: JobRecord) -> bool:
                    record.latest_checkpoint = CheckpointRef(step=150, path="/c/150")
                    return True

                await made.jobs.mutate("f", saved)

        await bus.subscribe(bus.subjects.cmd("f", 0), count_the_checkpoint)
        await made.ledger.watch()
        drained = asyncio.create_task(drain_node(bus, made.backend, "n1", WAIT))
        moved: dict[str, FaultDetected] = {}
        for _ in range(2):  # the restarter's fault path moves each job (here: the queue)
            fault = await asyncio.wait_for(made.moves.get(), WAIT)
            assert fault.job is not None
            moved[fault.job] = fault

            def placed_elsewhere(record: JobRecord) -> bool:
                record.placements = [p.model_copy(update={"node": "n3"}) for p in record.placements]
                return True

            await made.jobs.mutate(fault.job, placed_elsewhere)
        done = await drained

    assert sorted(moved) == ["f", "g"]
    assert {f.reason for f in moved.values()} == {"node_drained"}
    assert done.done is not None and done.by == "operator"
    assert done.jobs == {
        "f": "checkpointed step 150, then moved",
        "g": "moved at once: its workers do not run resurge.worker (no checkpoint to ask for)",
    }
    assert made.cordons()[0][0] == "n1" and "drained" in made.cordons()[0][1]


async def test_draining_an_unknown_node_names_the_known_ones(bus: Bus, settings: Settings) -> None:
    async with ledger_of(bus, settings, [], NodePolicy()) as made:
        with pytest.raises(LookupError, match=r"no node named 'n9' \(nodes: n1, n2, n3\)"):
            await drain_node(bus, made.backend, "n9", WAIT)


async def test_a_node_tainted_noexecute_under_a_job_is_drained_first(
    bus: Bus, settings: Settings
) -> None:
    """Another controller's NoExecute taint: the restarter asks the node's drain itself
    (by ``kubernetes``), and the drain moves the job off as an operator's would."""
    async with ledger_of(bus, settings, [running("h", ["n2"])], NodePolicy()) as made:
        await made.ledger.watch()
        watch = EvictionWatch(made.ledger.ctx, made.backend, made.ledger.nodes, made.jobs)
        watch.start()
        tainted = made.backend.nodes["n2"].model_copy(
            update={"taints": [Taint(key="node.kubernetes.io/unreachable", effect="NoExecute")]}
        )
        await made.backend.report_node(tainted)
        moved = await asyncio.wait_for(made.moves.get(), WAIT)
        assert (moved.job, moved.node, moved.reason) == ("h", "n2", "node_drained")
        record = await made.ledger.nodes.get("n2")
        assert record is not None and record[0].drain is not None
        assert record[0].drain.by == "kubernetes"
        assert record[0].drain.reason == "NoExecute taint node.kubernetes.io/unreachable"
        await watch.seen("n2", record[0].drain.reason)  # the same sign again: no new drain
        again = await made.ledger.nodes.get("n2")
        assert again is not None and again[0].drain is not None
        assert again[0].drain.requested == record[0].drain.requested
