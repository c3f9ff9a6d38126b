"""The story's watch records each event once, however often core NATS passes it on."""

from __future__ import annotations

import asyncio

from resurge.events import JobPhase, PhaseChanged, Source
from resurge.local.story import Observed, Watch


def test_a_republished_event_is_recorded_once_and_a_new_one_is_recorded() -> None:
    async def scenario() -> list[str]:
        watch = Watch()
        source = Source(service="test", instance="t:1")
        first = PhaseChanged(source=source, job="j", phase=JobPhase.RUNNING)
        second = PhaseChanged(source=source, job="j", phase=JobPhase.SUCCEEDED)
        for event in (first, first, second, first):
            await watch.add(Observed(subject="resurge.action.j", event=event))
        return [o.event.id for o in watch.observed]

    ids = asyncio.run(scenario())
    assert len(ids) == 2 and len(set(ids)) == 2
