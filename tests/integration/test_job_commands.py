"""send_stops: what the restarter's Stops tell the agents, as they arrive on the bus."""

from __future__ import annotations

from resurge.control.effects.job_messages import send_stops
from resurge.control.state.records import JobRecord, Placement
from resurge.events import Stop
from resurge.local import job_factory
from resurge.runtime.bus import Bus
from tests.collect import Events


def record() -> JobRecord:
    spec = job_factory.job("j", recovery={"stopGraceSeconds": 7}, preload=None)
    placements = [Placement(replica=0, node="n0"), Placement(replica=1, node="n1")]
    return JobRecord(name="team.job", spec=spec, generation=3, placements=placements)


async def stops_sent(bus: Bus, hung_ranks: list[int] | None, graceful: bool) -> list[Stop]:
    seen = Events()
    sub = await bus.subscribe(bus.subjects.cmd("team.job", None), seen.add)
    await bus.nc.flush()
    try:
        await send_stops(bus, record(), 3, "why", hung_ranks=hung_ranks, graceful=graceful)
        await seen.wait_for(lambda items: len(items) == 2)
    finally:
        await sub.unsubscribe()
    return seen.of(Stop)


async def test_stops_carry_the_grace_and_the_hung_ranks(bus: Bus) -> None:
    stops = await stops_sent(bus, hung_ranks=[3], graceful=True)
    assert {s.replica for s in stops} == {0, 1}
    for stop in stops:
        assert (stop.generation, stop.graceful, stop.timeout_seconds) == (3, True, 7.0)
        assert stop.hung_ranks == [3] and not stop.final


async def test_stops_without_grace_and_without_hung_ranks(bus: Bus) -> None:
    stops = await stops_sent(bus, hung_ranks=None, graceful=False)
    assert [(s.graceful, s.hung_ranks) for s in stops] == [(False, [])] * 2
