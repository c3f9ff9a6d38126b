"""The launch agent never waits on a bus that is down, and never raises from it: the
output pump that publishes log lines goes on to report its worker's exit, which waits
in the agent's outbox (in order, behind the lines) until the bus is back."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from prometheus_client import CollectorRegistry

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.events import Assign, ReplicaSlot, Source
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_node_agent.launch.agent import LaunchAgent
from resurge_node_agent.launch.workers import WorkerExit

SOURCE = Source(service="node-agent", instance="n:1")


class DownBus:
    """A bus whose connection is down until ``connected`` is set; publishes are recorded."""

    def __init__(self, settings: Settings) -> None:
        self.subjects = settings.subjects
        self.source = SOURCE
        self.connected = False
        self.sent: list[Any] = []

    async def publish_nowait(self, _subject: str, event: Any) -> None:
        assert self.connected
        self.sent.append(event)

    async def publish(self, _subject: str, event: Any) -> None:
        assert self.connected
        self.sent.append(event)


async def test_events_wait_in_order_while_the_bus_is_down_and_are_sent_when_it_is_back() -> None:
    settings = Settings(nats_url="nats://127.0.0.1:1", namespace="t")
    registry = CollectorRegistry()
    bus = DownBus(settings)
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
        agent.outbox.start()
        for _ in range(3):
            await agent._line(assign, 0, "stdout", "a line")
        await agent._exited(assign, WorkerExit(0, 42, 1, None, expected=False))
        assert registry.get_sample_value("resurge_outbox_buffered_events") == 4
        assert bus.sent == []
        bus.connected = True
        assert await agent.outbox.flushed(5.0)
        await agent.outbox.close()
    assert [e.kind for e in bus.sent] == ["log_line"] * 3 + ["process_exited"]
    assert registry.get_sample_value("resurge_outbox_buffered_events") == 0
