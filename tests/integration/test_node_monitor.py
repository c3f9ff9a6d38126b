"""A real node monitor process reconciling the worker groups the cluster backend places on
its node: a new group starts a launch agent that runs the spec it was handed, a bumped
incarnation recreates it, a deleted group ends it, and another node's group is not its
business. Real nats-server, the real local backend, real processes.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from resurge.cluster import ClusterBackend, WorkerGroupSpec, open_backend
from resurge.events import (
    Assign,
    Event,
    LogLine,
    NodeReport,
    ProcessExited,
    ProcessStarted,
    ReplicaSlot,
)
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.collect import Events
from tests.monitor_process import running_monitor

JOB = "j.m"
# Prints what only the worker group spec carried, then waits to be stopped.
PRINT_AND_WAIT = "import os, time; print(os.environ['FROM_SPEC'], flush=True); time.sleep(120)"


@pytest.fixture
async def monitor(settings: Settings, tmp_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    agents = tmp_path / "agents"
    try:
        async with running_monitor(
            settings, tmp_path, "--log-dir", str(agents), stop_seconds=30
        ) as process:
            yield process
    finally:
        for agent_log in sorted(agents.glob("*.log")):
            print(agent_log.name, agent_log.read_text(), sep="\n")


@pytest.fixture
async def backend(bus: Bus, settings: Settings) -> ClusterBackend:
    return await open_backend(bus, settings)


def since(mark: int, test: Callable[[list[Event]], Any]) -> Callable[[list[Event]], Any]:
    """``test`` applied to the events that arrived after the first ``mark``."""
    return lambda items: test(items[mark:])


def of_job(kind: type, items: list[Event]) -> list[Any]:
    return [e for e in items if isinstance(e, kind) and e.job == JOB]


def slots_free(free: int) -> Callable[[list[Event]], bool]:
    return lambda items: any(
        isinstance(e, NodeReport) and e.node == "n1" and e.slots_free == free for e in items
    )


async def test_monitor_runs_creates_again_and_ends_the_groups_placed_on_its_node(
    bus: Bus,
    backend: ClusterBackend,
    raw_events: Events,
    monitor: asyncio.subprocess.Process,
) -> None:
    spec = WorkerGroupSpec(
        job=JOB,
        replica=0,
        node="n1",
        nproc=1,
        command=[sys.executable, "-c", PRINT_AND_WAIT],
        env={"FROM_SPEC": "from the spec"},
        stop_grace_seconds=1,
        preload=["json"],
    )
    elsewhere = spec.model_copy(update={"job": "j.elsewhere", "node": "n2"})
    await backend.create_worker_group(elsewhere)
    await raw_events.wait_for(slots_free(2))  # the monitor is up and reporting

    mark = len(raw_events.items)
    await backend.create_worker_group(spec)
    await raw_events.wait_for(since(mark, slots_free(1)))
    await bus.publish(
        bus.subjects.cmd(JOB, 0),
        Assign(
            source=bus.source,
            job=JOB,
            replica=0,
            generation=0,
            world_size=1,
            rank_table=[ReplicaSlot(replica=0, node="n1", first_rank=0, nproc=1)],
            master_addr="127.0.0.1",
            master_port=29577,
        ),
    )
    [first] = await raw_events.wait_for(lambda items: of_job(ProcessStarted, items))
    await raw_events.wait_for(lambda items: of_job(LogLine, items))
    assert [e.line for e in of_job(LogLine, raw_events.items)] == ["from the spec"]

    # A new incarnation: the old agent ends its worker, a new agent runs the newest Assign.
    await backend.create_worker_group(spec.model_copy(update={"incarnation": 1}))
    started = await raw_events.wait_for(
        lambda items: len(of_job(ProcessStarted, items)) >= 2 and of_job(ProcessStarted, items)
    )
    assert [e.generation for e in started] == [0, 0] and started[1].pid != first.pid
    [ended] = of_job(ProcessExited, raw_events.items)
    assert ended.pid == first.pid and ended.expected

    # Deleted: its agent stops its worker and the node's slot is free again.
    mark = len(raw_events.items)
    await backend.delete_worker_group(JOB, 0, "n1")
    await raw_events.wait_for(since(mark, slots_free(2)))
    exits = await raw_events.wait_for(
        lambda items: len(of_job(ProcessExited, items)) == 2 and of_job(ProcessExited, items)
    )
    assert [e.pid for e in exits] == [first.pid, started[1].pid]
    assert all(e.expected for e in exits)
    assert not [e for e in raw_events.items if getattr(e, "job", None) == "j.elsewhere"]
