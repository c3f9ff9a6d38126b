"""Fixtures shared by integration tests: every raw event of the test's namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from resurge.runtime.bus import Bus
from tests.collect import Events


@pytest.fixture
async def raw_events(bus: Bus) -> AsyncIterator[Events]:
    events = Events()
    sub = await bus.subscribe(bus.subjects.all("raw"), events.add)
    await bus.nc.flush()
    yield events
    await sub.unsubscribe()
