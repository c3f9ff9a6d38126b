"""The outbox: bounded, in order, telemetry dropped oldest first, essential events never."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats.errors
import nats.js.errors
import pytest
from prometheus_client import CollectorRegistry

from resurge.events import (
    AgentState,
    AgentStateChanged,
    Envelope,
    LogLine,
    ProcessExited,
    Progress,
    Source,
)
from resurge.runtime.outbox import Outbox

SOURCE = Source(service="node-agent", instance="n:1")
WHERE = {"source": SOURCE, "job": "j", "replica": 0, "node": "n", "generation": 0}


def line(text: str) -> LogLine:
    return LogLine(stream="stdout", line=text, rank=0, local_rank=0, **WHERE)


def progress(step: int) -> Progress:
    return Progress(step=step, rank=0, local_rank=0, **WHERE)


def exited(pid: int) -> ProcessExited:
    return ProcessExited(
        pid=pid, local_world_size=1, exit_code=None, signal="SIGKILL", expected=False,
        rank=0, local_rank=0, **WHERE,
    )  # fmt: skip


def state(detail: str) -> AgentStateChanged:
    return AgentStateChanged(state=AgentState.RUNNING, detail=detail, **WHERE)


class Bus:
    """A bus to send through: down until ``connected``; ``fail`` holds the errors its
    next publishes raise, one each; what it sent, with how (acked or not)."""

    def __init__(self) -> None:
        self.connected = False
        self.fail: list[Exception] = []
        self.sent: list[tuple[str, Envelope, bool]] = []
        self.attempts = 0

    async def _send(self, subject: str, event: Envelope, acked: bool) -> None:
        assert self.connected, "sent while the bus is down"
        self.attempts += 1
        if self.fail:
            raise self.fail.pop(0)
        self.sent.append((subject, event, acked))

    async def publish(self, subject: str, event: Envelope) -> None:
        await self._send(subject, event, True)

    async def publish_nowait(self, subject: str, event: Envelope) -> None:
        await self._send(subject, event, False)

    def kinds(self) -> list[str]:
        return [event.kind for _, event, _ in self.sent]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def bus() -> Bus:
    return Bus()


@pytest.fixture
async def outbox(bus: Bus, registry: CollectorRegistry) -> AsyncIterator[Outbox]:
    box = Outbox(bus, registry, capacity=5)
    box.start()
    yield box
    await box.close(wait_seconds=0)


def buffered(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("resurge_outbox_buffered_events")


def dropped(registry: CollectorRegistry, kind: str) -> float:
    return registry.get_sample_value("resurge_outbox_dropped_total", {"kind": kind}) or 0.0


def put(box: Outbox, *events: Envelope) -> None:
    for event in events:
        box.put(f"raw.{event.kind}", event)


async def test_events_wait_while_down_and_are_sent_in_order_once_back(
    outbox: Outbox, bus: Bus, registry: CollectorRegistry
) -> None:
    events = [state("a"), line("1"), progress(1), exited(7), line("2")]
    put(outbox, *events)
    await asyncio.sleep(0.15)  # the task looked at the bus at least once, and waited
    assert bus.sent == [] and outbox.buffered == 5 and buffered(registry) == 5

    bus.connected = True
    assert await outbox.flushed(5.0)
    assert [event for _, event, _ in bus.sent] == events
    assert [subject for subject, _, _ in bus.sent] == [f"raw.{e.kind}" for e in events]
    # Essential events wait for the stream's ack; telemetry does not.
    assert [acked for _, _, acked in bus.sent] == [True, False, False, True, False]
    assert buffered(registry) == 0


async def test_a_new_event_queues_behind_a_backlog(outbox: Outbox, bus: Bus) -> None:
    bus.connected = True
    bus.fail = [nats.errors.TimeoutError(), nats.errors.TimeoutError()]
    put(outbox, exited(1))  # not acked twice: still at the head
    put(outbox, line("after"), exited(2))
    assert await outbox.flushed(5.0)
    assert bus.kinds() == ["process_exited", "log_line", "process_exited"]
    assert [e.pid for _, e, _ in bus.sent if isinstance(e, ProcessExited)] == [1, 2]


async def test_a_full_outbox_drops_the_oldest_telemetry_first(
    outbox: Outbox, bus: Bus, registry: CollectorRegistry
) -> None:
    put(outbox, line("1"), exited(1), progress(1), line("2"), state("a"))
    put(outbox, line("3"), progress(2))  # full: line 1 goes, then progress 1
    assert outbox.buffered == 5
    assert dropped(registry, "log_line") == 1 and dropped(registry, "progress") == 1

    bus.connected = True
    assert await outbox.flushed(5.0)
    sent = [getattr(e, "line", None) or getattr(e, "step", None) or e.kind for _, e, _ in bus.sent]
    assert sent == ["process_exited", "2", "agent_state", "3", 2]


async def test_essential_events_are_never_dropped_even_past_the_bound(
    outbox: Outbox, bus: Bus, registry: CollectorRegistry
) -> None:
    put(outbox, *[exited(pid) for pid in range(4)], line("old"))
    put(outbox, *[exited(pid) for pid in range(4, 8)])  # the line goes, then past the bound
    put(outbox, line("new"), progress(3))  # nothing to drop but themselves
    assert outbox.buffered == 8 > outbox.capacity
    assert dropped(registry, "log_line") == 2 and dropped(registry, "progress") == 1
    assert dropped(registry, "process_exited") == 0

    bus.connected = True
    assert await outbox.flushed(5.0)
    assert [e.pid for _, e, _ in bus.sent if isinstance(e, ProcessExited)] == list(range(8))
    assert bus.kinds() == ["process_exited"] * 8


async def test_telemetry_the_connection_does_not_take_is_dropped_and_counted(
    outbox: Outbox, bus: Bus, registry: CollectorRegistry
) -> None:
    bus.connected = True
    bus.fail = [nats.errors.OutboundBufferLimitError()]
    put(outbox, line("lost"), exited(1))
    assert await outbox.flushed(5.0)
    assert bus.kinds() == ["process_exited"] and bus.attempts == 2
    assert dropped(registry, "log_line") == 1


async def test_an_essential_event_the_server_refuses_is_counted_and_not_sent_again(
    outbox: Outbox, bus: Bus, registry: CollectorRegistry
) -> None:
    bus.connected = True
    bus.fail = [
        nats.js.errors.ServiceUnavailableError(),  # a restarting server: tried again
        nats.js.errors.BadRequestError(),  # refused for good
    ]
    put(outbox, exited(1), state("next"))
    assert await outbox.flushed(5.0)
    assert bus.kinds() == ["agent_state"] and bus.attempts == 3
    refused = registry.get_sample_value("resurge_outbox_refused_total", {"kind": "process_exited"})
    assert refused == 1


async def test_close_sends_what_is_left(bus: Bus, registry: CollectorRegistry) -> None:
    box = Outbox(bus, registry)
    box.start()
    bus.connected = True
    put(box, state("exiting"))
    await box.close(wait_seconds=5.0)
    assert bus.kinds() == ["agent_state"]


async def test_close_gives_up_after_its_wait_while_the_bus_is_down(
    bus: Bus, registry: CollectorRegistry
) -> None:
    box = Outbox(bus, registry)
    box.start()
    put(box, state("exiting"))
    await box.close(wait_seconds=0.05)
    assert bus.sent == [] and box.buffered == 1


def test_put_never_waits_and_a_bound_is_at_least_one(bus: Bus, registry: CollectorRegistry) -> None:
    box = Outbox(bus, registry, capacity=1)  # no loop task at all: put is plain code
    put(box, line("1"), line("2"))
    assert box.buffered == 1 and dropped(registry, "log_line") == 1
    with pytest.raises(ValueError):
        Outbox(bus, CollectorRegistry(), capacity=0)
