"""The launch agent drops telemetry it cannot send (counted), and never raises from it:
the output pump that publishes log lines goes on to report its worker's exit."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import nats.errors
from prometheus_client import CollectorRegistry

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.events import Assign, ReplicaSlot, Source
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_node_agent.launcher import LaunchAgent
from resurge_node_agent.workers import WorkerExit

SOURCE = Source(service="node-agent", instance="n:1")


class FullBus:
    """A bus whose connection is down with its buffer full: fire-and-forget publishes
    raise as nats.py's do, acked publishes are recorded."""

    def __init__(self, settings: Settings) -> None:
        self.subjects = settings.subjects
        self.source = SOURCE
        self.acked: list[Any] = []

    async def publish_nowait(self, _subject: str, _event: Any) -> None:
        raise nats.errors.OutboundBufferLimitError

    async def publish(self, _subject: str, event: Any) -> None:
        self.acked.append(event)


async def test_telemetry_is_dropped_and_counted_and_the_exit_still_published() -> None:
    settings = Settings(nats_url="nats://127.0.0.1:1", namespace="t")
    registry = CollectorRegistry()
    bus = FullBus(settings)
    async with AsyncExitStack() as stack:
        ctx = ServiceContext("node-agent", settings, bus, registry, stack)  # type: ignore[arg-type]
        spec = WorkerGroupSpec(job="j", replica=0, node="n", nproc=1, command=["x"])
        agent = LaunchAgent(ctx, spec)
        assign = Assign(
            source=SOURCE,
            job="j",
            replica=0,
            node="n",
            generation=0,
            world_size=1,
            rank_table=[ReplicaSlot(replica=0, node="n", first_rank=0, nproc=1)],
            master_addr="127.0.0.1",
            master_port=29500,
        )
        for _ in range(3):
            await agent._line(assign, 0, "stdout", "a line")
        await agent._exited(assign, WorkerExit(0, 42, 1, None, expected=False))
    dropped = registry.get_sample_value(
        "resurge_agent_telemetry_dropped_total", {"kind": "log_line"}
    )
    assert dropped == 3
    assert [e.kind for e in bus.acked] == ["process_exited"]
