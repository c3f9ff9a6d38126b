"""``Bus.bind`` binds a declared subscription as its reader says, through a real
nats-server: a watching reader's subscription is returned (and ends when unsubscribed), a
reader binds the stream of its kinds (the detector's two raw readers, two streams), and
a command inbox is not bound by the bus."""

from __future__ import annotations

import asyncio

import pytest

from resurge.contract.subscriptions import (
    DETECTOR_FAULTS,
    DETECTOR_RAW,
    LAUNCH_COMMANDS,
    SCALER_RESIZE_AGENTS,
    Scope,
)
from resurge.events import AgentState, AgentStateChanged, Event
from resurge.runtime.bus import Bus


def waiting(bus: Bus, job: str, replica: int) -> AgentStateChanged:
    return AgentStateChanged(
        source=bus.source, job=job, replica=replica, node="n0", state=AgentState.WAITING
    )


async def test_a_watch_reads_its_jobs_subject_until_unsubscribed(bus: Bus) -> None:
    seen: asyncio.Queue[tuple[Event, str]] = asyncio.Queue()

    async def on_state(event: Event, subject: str) -> None:
        await seen.put((event, subject))

    [subscription] = await bus.bind(SCALER_RESIZE_AGENTS, on_state, Scope(job="grows.1"))
    await bus.publish(bus.subjects.raw("other", "agent_state", "n0"), waiting(bus, "other", 0))
    mine = waiting(bus, "grows.1", 1)
    await bus.publish(bus.subjects.raw("grows.1", "agent_state", "n0"), mine)
    event, subject = await asyncio.wait_for(seen.get(), 10)
    assert event == mine and subject == bus.subjects.raw("grows.1", "agent_state", "n0")
    await subscription.unsubscribe()
    await bus.publish(bus.subjects.raw("grows.1", "agent_state", "n0"), waiting(bus, "grows.1", 2))
    await bus.nc.flush()
    assert seen.empty()


async def test_the_detector_reads_telemetry_and_fault_grade_kinds_from_their_streams(
    bus: Bus,
) -> None:
    async def on_raw(events: list[Event]) -> None:
        pass

    await bus.bind(DETECTOR_FAULTS, on_raw, Scope(group="d"))
    await bus.bind(DETECTOR_RAW, on_raw, Scope(group="d"))
    assert await consumers(bus) == [("d", bus.subjects.all("raw"))]
    assert await consumers(bus, "raw-faults") == [("d-faults", bus.subjects.all("raw"))]


async def consumers(bus: Bus, stream: str = "raw") -> list[tuple[str | None, str | None]]:
    """A stream's consumers: name and filter."""
    infos = await bus.js.consumers_info(bus.subjects.stream(stream))
    return [(info.name, info.config.filter_subject) for info in infos]


async def test_a_command_inbox_is_not_bound_by_the_bus(bus: Bus) -> None:
    async def on_command(event: Event) -> None:
        pass

    with pytest.raises(ValueError, match="inbox reader is not bound here"):
        await bus.bind(LAUNCH_COMMANDS, on_command, Scope(job="j", replica=0))
