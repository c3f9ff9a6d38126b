"""A NATS connection the server resets while the bus drains it (a service stopping just
as the network or the server drops it) is closed, not raised: a stop is no failure."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest

from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.integration.blackhole_proxy import BlackholeProxy


def upstream_of(nats_url: str) -> tuple[str, int]:
    server = urlparse(nats_url.split(",")[0])
    assert server.hostname is not None and server.port is not None
    return server.hostname, server.port


@pytest.fixture
async def proxy(nats_url: str) -> AsyncIterator[BlackholeProxy]:
    proxy = await BlackholeProxy(upstream_of(nats_url)).start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_a_connection_reset_while_draining_is_closed_not_raised(
    proxy: BlackholeProxy, namespace: str
) -> None:
    bus = await Bus.connect(Settings(nats_url=proxy.url, namespace=namespace), "test")
    try:
        await bus.ensure_streams()
        await bus.nc.subscribe(f"{namespace}.test.reset")  # drain unsubscribes it: the cue
        proxy.reset_on(b"UNSUB")

        await bus.close()

        assert proxy.resets == 1  # the reset came mid-drain, as the test means it to
        assert bus.nc.is_closed
    finally:
        await bus.nc.close()


async def test_a_server_that_stops_answering_while_draining_is_closed_not_raised(
    proxy: BlackholeProxy, namespace: str
) -> None:
    # Seen in a local cluster's supervisor: its probe connection's drain ended in
    # nats.py's FlushTimeoutError, which stopped the supervisor.
    bus = await Bus.connect(Settings(nats_url=proxy.url, namespace=namespace), "test")
    try:
        await bus.nc.subscribe(f"{namespace}.test.blackhole")
        proxy.blackhole()  # nothing answers the drain's UNSUB and flush now

        await bus.close()

        assert bus.nc.is_closed  # and nothing raised (nats.py's FlushTimeoutError did)
    finally:
        await bus.nc.close()
