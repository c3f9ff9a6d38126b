"""A half-open connection to NATS (a partition: the socket stays open, nothing comes
through) is found by the bus's pings within seconds, and the bus says it is down; the
server's pings find it too, and what it was sent reaches the others in seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest

from resurge.contract.subscriptions import RESTARTER_FAULTS
from resurge.events import FaultDetected, FaultScope
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.integration.blackhole_proxy import BlackholeProxy

# "Within seconds": about 6 s with the default 2 s pings (3 intervals); nats.py's own
# default is a ping every 2 minutes, 2 unanswered before it gives up (4 to 6 minutes).
FOUND_WITHIN_SECONDS = 10.0
# A message delivered to a member cut off reaches another member after the first
# redeliveries (2 s, 4 s) or once the server drops the dead member (its pings: about
# 6 s); with the old fixed 30 s wait it took 30 s or more.
REACHED_WITHIN_SECONDS = 15.0


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


async def test_a_cut_off_member_of_a_queue_group_holds_no_message_for_long(
    proxy: BlackholeProxy, settings: Settings
) -> None:
    """Two restarters share the fault consumer; one's link is partitioned just before
    faults come. The server still delivers some to it (its side of the socket is open),
    and they are lost on the way: each must reach the other restarter within seconds
    (a CI run's fault waited 2 x 30 s, the fixed ack wait, once for each restarter).
    The cut-off member subscribes first, so it is in the group for the first delivery."""
    cut_off = await Bus.connect(
        Settings(nats_url=proxy.url, namespace=settings.namespace), "restarter-cut-off"
    )
    healthy = await Bus.connect(settings, "restarter-healthy")
    got: asyncio.Queue[str] = asyncio.Queue()

    async def on_healthy(event: FaultDetected) -> None:
        await got.put(event.fault_id)

    async def on_cut_off(event: FaultDetected) -> None:
        raise AssertionError("nothing reaches a member across a partition")

    try:
        await cut_off.ensure_streams()
        await cut_off.bind(RESTARTER_FAULTS, on_cut_off)
        await healthy.bind(RESTARTER_FAULTS, on_healthy)
        proxy.blackhole()
        published = time.monotonic()
        ids = [f"f{i}" for i in range(10)]
        for fault_id in ids:
            event = FaultDetected(
                source=healthy.source, job="j.1", fault_id=fault_id,
                scope=FaultScope.PROCESS, reason="process_crash",
            )  # fmt: skip
            await healthy.publish(healthy.subjects.fault("j.1", "process"), event)
        received = [await asyncio.wait_for(got.get(), 30) for _ in ids]
        assert sorted(received) == ids
        assert time.monotonic() - published <= REACHED_WITHIN_SECONDS
    finally:
        await healthy.close()
        await cut_off.nc.close()  # no drain across a partition
