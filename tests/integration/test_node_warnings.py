"""The restarter's node ledger and GPU warning signs, on a real nats-server: a warning
that predicts a failure moves each job on the node off it at its next checkpoint, once
per warning however many jobs' faults report it; a thermal one only counts; proactive
moves can be turned off. The move is the restarter's fault path, here a queue the test
reads (as in test_node_ledger.py); the cluster is :class:`FakeBackend`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from resurge.cluster import NodeInfo
from resurge.control.decisions.node_score import NodePolicy
from resurge.control.state.node_health import NodeHealthStore
from resurge.control.state.records import CheckpointRef, JobRecord, JobStore
from resurge.events import CheckpointNow, FaultDetected, FaultScope, Source
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_restarter.node_ledger import WARNING_REASON, NodeLedger
from resurge_restarter.node_moves import HOLD_MARGIN_SECONDS
from tests.integration.fake_backend import FakeBackend
from tests.integration.test_node_ledger import running

DETECTOR = Source(service="detector", instance="d")
WAIT = 20.0
SINCE = datetime(2026, 1, 1, tzinfo=UTC).isoformat()


def warning(job: str, sign: str, node: str = "n1") -> FaultDetected:
    """A warning sign on GPU 0 of ``node``, as the gpu_warnings detector reports it."""
    return FaultDetected(
        source=DETECTOR,
        fault_id=f"gpu_warning:{node}:0:{sign}:{SINCE}:{job}",
        scope=FaultScope.NODE,
        reason="gpu_warning",
        message=f"GPU 0 on {node}: {sign}",
        evidence={"node": node, "gpu": 0, "sign": sign, "since": SINCE},
        alert_only=True,
        job=job,
        node=node,
        generation=2,
    )


@contextlib.asynccontextmanager
async def ledger_of(
    bus: Bus, settings: Settings, records: list[JobRecord]
) -> AsyncIterator[tuple[NodeLedger, JobStore, asyncio.Queue[FaultDetected]]]:
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

    ledger = NodeLedger(ctx, backend, NodeHealthStore(kv), jobs, move, NodePolicy())
    try:
        yield ledger, jobs, moves
    finally:
        for task in list(ctx.tasks):
            task.cancel()
        for task in list(ctx.tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await ctx.exit_stack.aclose()


async def settled(ledger: NodeLedger) -> None:
    """Every move the ledger started has ended."""
    await asyncio.wait_for(asyncio.gather(*ledger.ctx.tasks), WAIT)


async def test_a_predicted_failure_checkpoints_then_moves_each_job_once(
    bus: Bus, settings: Settings
) -> None:
    records = [running("a", ["n1", "n2"], checkpoints=True), running("b", ["n3", "n1"])]
    async with ledger_of(bus, settings, records) as (ledger, jobs, moves):

        async def checkpoint(event: object, _subject: str) -> None:
            if isinstance(event, CheckpointNow):

                def saved(record: JobRecord) -> bool:
                    record.latest_checkpoint = CheckpointRef(step=130, path="/c/130")
                    return True

                await jobs.mutate("a", saved)  # every rank saved step 130, as counted
                asked.append(event)

        asked: list[CheckpointNow] = []
        await bus.subscribe(bus.subjects.cmd("a", 0), checkpoint)
        await ledger.on_fault(warning("a", "corrected_ecc_rising"))
        await ledger.on_fault(warning("b", "corrected_ecc_rising"))  # the same warning
        moved: dict[str, FaultDetected] = {}
        for _ in range(2):
            fault = await asyncio.wait_for(moves.get(), WAIT)
            moved[str(fault.job)] = fault
        await settled(ledger)
        assert moves.empty()  # once per job: b's report of the warning moved nothing more

        assert sorted(moved) == ["a", "b"]
        assert {(f.reason, f.node, f.scope) for f in moved.values()} == {
            (WARNING_REASON, "n1", FaultScope.NODE)
        }
        assert (moved["a"].replica, moved["b"].replica) == (0, 1)
        assert moved["a"].evidence["sign"] == "corrected_ecc_rising"
        assert len(asked) == 1 and "warns of a failure" in asked[0].reason
        # Its workers hold after saving until the move's stop: the bound and a margin.
        bound = records[0].spec.spec.elastic.checkpoint_timeout_seconds
        assert asked[0].hold_seconds == bound + HOLD_MARGIN_SECONDS
        record = await ledger.nodes.get("n1")
        assert record is not None and record[0].quarantine is None
        assert record[0].counted == 1 and record[0].incidents[0].rule == "ecc_warning_sign"

        await ledger.on_fault(warning("a", "corrected_ecc_rising"))  # redelivered
        await settled(ledger)
        assert moves.empty()


async def test_a_thermal_warning_counts_and_moves_nothing(bus: Bus, settings: Settings) -> None:
    async with ledger_of(bus, settings, [running("c", ["n1"])]) as (ledger, _jobs, moves):
        await ledger.on_fault(warning("c", "thermal_throttling"))
        await settled(ledger)
        assert moves.empty()
        record = await ledger.nodes.get("n1")
        assert record is not None and record[0].incidents[0].rule == "thermal_throttling"


async def test_proactive_moves_turned_off_only_count(bus: Bus, settings: Settings) -> None:
    off = settings.model_copy(update={"node_proactive_moves": False})
    async with ledger_of(bus, off, [running("d", ["n1"])]) as (ledger, _jobs, moves):
        await ledger.on_fault(warning("d", "retired_pages_growing"))
        await settled(ledger)
        assert moves.empty()
        record = await ledger.nodes.get("n1")
        assert record is not None and record[0].counted == 1
