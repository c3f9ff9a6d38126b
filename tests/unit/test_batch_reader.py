"""The batch consumer's batching, counted: a list is handed over as soon as nothing more
is waiting, never held for a window, and under load it grows up to its bound."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from resurge.events import DeadLetterReason, Event, FaultDetected, FaultScope, Source
from resurge.runtime.bus import BatchReader

SOURCE = Source(service="test", instance="t")


@dataclass
class FakeMsg:
    """What the reader touches of a message: its event and its ack."""

    event: Event | None
    acked: int = 0

    async def ack(self) -> None:
        self.acked += 1


@dataclass
class Harness:
    """A reader whose subscription has ``waiting`` messages queued behind the current one."""

    batch: int = 4
    waiting: int = 0
    handed: list[list[Event]] = field(default_factory=list)
    dead: list[FakeMsg] = field(default_factory=list)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    reader: BatchReader = field(init=False)

    def __post_init__(self) -> None:
        async def handler(events: list[Event]) -> None:
            self.handed.append(events)

        async def dead_letter(msg: Any, _reason: DeadLetterReason, _detail: str) -> None:
            self.dead.append(msg)

        def decode(msg: Any) -> tuple[Event | None, tuple[DeadLetterReason, str] | None]:
            if msg.event is None:
                return None, (DeadLetterReason.INVALID, "bad")
            return msg.event, None

        outcomes = Counter("m", "m", ["outcome"], registry=self.registry)
        self.reader = BatchReader(
            handler,
            lambda: self.waiting,
            batch=self.batch,
            decode=decode,
            dead_letter=dead_letter,
            outcomes=outcomes,
            backlog=Gauge("b", "b", registry=self.registry),
            batches=Counter("n", "n", registry=self.registry),
        )

    async def deliver(self, msg: FakeMsg, waiting: int) -> None:
        self.waiting = waiting
        await self.reader.on_message(msg)  # type: ignore[arg-type]


def event(i: int) -> FaultDetected:
    return FaultDetected(
        source=SOURCE, job="j", fault_id=str(i), scope=FaultScope.PROCESS, reason="x"
    )


async def test_a_lone_event_is_handed_over_within_the_call_that_received_it() -> None:
    h = Harness()
    msg = FakeMsg(event(1))
    await h.deliver(msg, waiting=0)
    # No other task ran: the list went over inside on_message, with no window awaited.
    assert h.handed == [[msg.event]]
    assert msg.acked == 1
    assert h.reader.flushes == 1


async def test_every_event_on_a_quiet_bus_is_its_own_list() -> None:
    h = Harness(batch=500)
    for i in range(10):
        await h.deliver(FakeMsg(event(i)), waiting=0)
    assert [len(b) for b in h.handed] == [1] * 10
    assert h.reader.flushes == 10


async def test_a_burst_is_one_list_handed_over_when_the_last_of_it_arrives() -> None:
    h = Harness(batch=10)
    msgs = [FakeMsg(event(i)) for i in range(5)]
    for i, msg in enumerate(msgs):
        await h.deliver(msg, waiting=len(msgs) - 1 - i)
        assert len(h.handed) == (1 if i == len(msgs) - 1 else 0)
    assert h.handed == [[m.event for m in msgs]]
    assert [m.acked for m in msgs] == [0, 0, 0, 0, 1]  # ack-all: the last covers the list


async def test_under_load_lists_are_bounded_by_the_batch_size() -> None:
    h = Harness(batch=4)
    for i in range(10):
        await h.deliver(FakeMsg(event(i)), waiting=100)  # always more waiting
    assert [len(b) for b in h.handed] == [4, 4]
    await h.deliver(FakeMsg(event(10)), waiting=0)
    assert [len(b) for b in h.handed] == [4, 4, 3]


async def test_a_list_of_only_bad_messages_is_acked_without_calling_the_handler() -> None:
    h = Harness()
    bad = FakeMsg(None)
    await h.deliver(bad, waiting=0)
    assert h.dead == [bad]
    assert h.handed == []
    assert bad.acked == 1


async def test_a_failed_handler_leaves_the_list_unacked() -> None:
    h = Harness()

    async def failing(_events: list[Event]) -> None:
        raise RuntimeError("boom")

    h.reader.handler = failing
    msg = FakeMsg(event(1))
    await h.deliver(msg, waiting=0)
    assert msg.acked == 0
    assert h.registry.get_sample_value("m_total", {"outcome": "retried"}) == 1


async def test_a_deep_backlog_lets_other_tasks_run_between_its_messages() -> None:
    h = Harness(batch=1000)
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(other())
    await asyncio.sleep(0)
    assert turns == 1
    for i in range(320):
        await h.deliver(FakeMsg(event(i)), waiting=1000)  # always more waiting: no list
    task.cancel()
    # One turn for the other task every 32 messages kept (none without the yields).
    assert turns == 1 + 320 // 32
    assert h.handed == []
