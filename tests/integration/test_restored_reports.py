"""Where a generation's state came from, from a worker to the job's status: a real
launch agent process turns each worker's ``restored`` line into a StateRestored event on
the raw subjects; the restarter's declared subscription, on a real nats-server, folds
the reports into the job record; ``resurge status JOB`` says it.

Three local ranks: rank 0 uses ``resurge.worker`` (it sends the line ``protect()`` sends
after its restore; protect itself needs torch and is tested with it), rank 1 never
imports resurge and speaks the wire protocol itself (any language can), rank 2 is a plain
script that registers nothing and sends nothing (today's behaviour: no report).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from rich.console import Console

from resurge.cli.status import describe
from resurge.cluster import NodeInfo
from resurge.contract.subscriptions import RESTARTER_RESTORED
from resurge.control.decisions.worker_groups import worker_groups
from resurge.control.state.records import JobRecord, JobStore, Placement, status_view
from resurge.events import Event, JobPhase, LogLine, StateRestored
from resurge.local import job_factory
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_restarter.service import Restarter
from tests.collect import Events
from tests.integration.fake_backend import FakeBackend
from tests.integration.test_node_agent import assign, start_agent, stop_for_good

JOB = "j.x"  # the job test_node_agent's agent runs
WAIT = 20.0

WORKER = r"""
import json, os, socket, time
rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
generation = int(os.environ["RESURGE_GENERATION"])
if local_rank == 0:
    from resurge import worker
    from resurge.worker.wire import restored_line
    run = worker.connect()
    run._send(restored_line(run.generation, 119, "memory", "step 119 from its node's memory"))
    run.progress(120)
elif local_rank == 1:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(os.environ["RESURGE_AGENT_SOCKET"])
    said = [
        {"type": "hello", "local_rank": local_rank, "rank": rank, "pid": os.getpid(),
         "generation": generation},
        {"type": "restored", "generation": generation, "step": 119, "source": "peer",
         "detail": "step 119 from rank 0's memory"},
    ]
    sock.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in said))
print(f"rank {rank} ready", flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture
async def store(bus: Bus) -> JobStore:
    store = JobStore(await bus.jobs_bucket())
    record = JobRecord(
        name=JOB,
        spec=job_factory.job("j"),
        phase=JobPhase.RUNNING,
        generation=0,
        placements=[Placement(replica=0, node="n1")],
    )
    assert await store.create(record)
    return store


@pytest.fixture
async def restarter(settings: Settings, bus: Bus, store: JobStore) -> AsyncIterator[Restarter]:
    ctx = ServiceContext("restarter", settings, bus, CollectorRegistry(), AsyncExitStack())
    record = await store.get(JOB)
    assert record is not None
    groups = worker_groups(record[0])
    yield Restarter(ctx, FakeBackend([NodeInfo(name="n1", slots=3)], groups), store, me="r")
    for task in list(ctx.tasks):
        task.cancel()
    for task in list(ctx.tasks):
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await ctx.exit_stack.aclose()


async def test_restored_lines_reach_the_record_and_the_status(
    bus: Bus,
    settings: Settings,
    raw_events: Events,
    store: JobStore,
    restarter: Restarter,
    tmp_path: Path,
) -> None:
    folded: asyncio.Queue[StateRestored] = asyncio.Queue()

    async def on_restored(events: list[Event]) -> None:
        await restarter.on_restored(events)
        for event in events:
            assert isinstance(event, StateRestored)
            folded.put_nowait(event)

    await bus.bind(RESTARTER_RESTORED, on_restored)
    agent = start_agent(settings, WORKER, tmp_path, nproc=3)
    try:
        await bus.publish(bus.subjects.cmd(JOB, 0), assign(bus, 0, nproc=3))
        reports = [await asyncio.wait_for(folded.get(), WAIT) for _ in range(2)]
        await raw_events.wait_for(
            lambda items: all(
                any(isinstance(e, LogLine) and e.line == f"rank {rank} ready" for e in items)
                for rank in range(3)
            )
        )
        await stop_for_good(bus, agent)
    finally:
        agent.kill()

    # The events, as the agent published them: stamped with the worker's place.
    assert sorted(
        (e.rank, e.local_rank, e.generation, e.replica, e.node, e.step, e.origin, e.detail)
        for e in reports
    ) == [
        (0, 0, 0, 0, "n1", 119, "memory", "step 119 from its node's memory"),
        (1, 1, 0, 0, "n1", 119, "peer", "step 119 from rank 0's memory"),
    ]
    # The plain rank, which never connected, said nothing: two reports in all.
    assert len(raw_events.of(StateRestored)) == 2

    found = await store.get(JOB)
    assert found is not None
    kept = found[0].restored
    assert kept is not None
    assert (kept.generation, kept.step, kept.ranks) == (0, 119, {"memory": [0], "peer": [1]})
    assert kept.detail == "step 119 from rank 0's memory"  # a peer's words over memory's

    view = status_view(found[0])
    assert view["restored"] == {
        "generation": 0,
        "step": 119,
        "sources": {"memory": 1, "peer": 1},
        "detail": "step 119 from rank 0's memory",
    }
    out = io.StringIO()
    Console(file=out, width=300, color_system=None).print(describe(view))
    [line] = [line for line in out.getvalue().splitlines() if line.startswith("Resumed:")]
    assert line.split(maxsplit=1)[1].strip() == (
        "step 119 from memory (1 rank) and peers (1 rank), generation 0"
    )
