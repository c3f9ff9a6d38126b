"""A half-open connection to NATS (a partition: the socket stays open, nothing comes
through) is found by the bus's pings within seconds, and the bus says it is down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest

from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.integration.blackhole_proxy import BlackholeProxy

# "Within seconds": about 6 s with the default 2 s pings (3 intervals); nats.py's own
# default is a ping every 2 minutes, 2 unanswered before it gives up (4 to 6 minutes).
FOUND_WITHIN_SECONDS = 10.0


@pytest.fixture
async def proxy(nats_url: str) -> AsyncIterator[BlackholeProxy]:
    server = urlparse(nats_url.split(",")[0])
    assert server.hostname is not None and server.port is not None
    proxy = await BlackholeProxy((server.hostname, server.port)).start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_a_half_open_connection_is_found_within_seconds(
    proxy: BlackholeProxy, namespace: str
) -> None:
    settings = Settings(nats_url=proxy.url, namespace=namespace)  # the default pings
    bus = await Bus.connect(settings, "test")
    changes: asyncio.Queue[bool] = asyncio.Queue()
    bus.on_connection_change(changes.put_nowait)
    try:
        await bus.ensure_streams()
        proxy.blackhole()
        cut = time.monotonic()
        assert await asyncio.wait_for(changes.get(), FOUND_WITHIN_SECONDS) is False
        assert not bus.connected
        assert time.monotonic() - cut <= FOUND_WITHIN_SECONDS

        proxy.heal()  # reconnects (a new connection) once bytes go through again
        assert await asyncio.wait_for(changes.get(), 10) is True
        await bus.jobs_bucket()  # and it is usable
        await bus.close()
    finally:
        await bus.nc.close()  # no drain across a partition (a failed test)
