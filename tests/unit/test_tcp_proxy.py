"""The chaos bench's TCP proxy (bench/tcp_proxy.py) between a real NATS client and a
real nats-server: it passes, delays, holds everything during a partition (the
connection stays open and what was sent arrives after the heal), and resets."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import nats
import pytest
from nats.aio.msg import Msg

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _proxy_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tcp_proxy", BENCH / "tcp_proxy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tcp_proxy"] = module
    spec.loader.exec_module(module)
    return module


async def test_pass_delay_blackhole_and_reset(nats_url: str) -> None:
    host, port = nats_url.removeprefix("nats://").split(":")
    proxy = await _proxy_module().Proxy((host, int(port))).start()
    disconnected = asyncio.Event()

    async def on_disconnect() -> None:
        disconnected.set()

    direct = await nats.connect(nats_url)
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def take(msg: Msg) -> None:
        await got.put(msg.data)

    # Subscribed before the proxied client connects: under load, a nats-server delivered
    # nothing to a subscription made (and flushed) after the publishing connection was
    # opened, about 1 time in 50, while a ">" watcher saw the message; with the
    # subscription first, 0 in 150.
    await direct.subscribe("proxy.test", cb=take)
    await direct.flush()
    client = await nats.connect(
        proxy.url, reconnect_time_wait=0.1, disconnected_cb=on_disconnect, ping_interval=60
    )
    try:
        await client.publish("proxy.test", b"pass")
        await client.flush(timeout=10)  # the server has it: the proxy passed it on
        assert await asyncio.wait_for(got.get(), 10) == b"pass"

        proxy.set("delay", delay_ms=300)
        started = time.monotonic()
        await client.flush(timeout=5)  # a PING and its PONG: each way delayed
        assert time.monotonic() - started >= 0.55

        proxy.set("blackhole")
        await client.publish("proxy.test", b"held")
        with pytest.raises(TimeoutError):  # nothing passes for half a second
            await asyncio.wait_for(got.get(), 0.5)
        assert client.is_connected, "the connection stays"
        proxy.set("pass")
        assert await asyncio.wait_for(got.get(), 5) == b"held"

        assert proxy.reset() == 1
        await asyncio.wait_for(disconnected.wait(), 5)
        await client.flush(timeout=5)  # the client connected again, through the proxy
    finally:
        await client.close()
        await direct.close()
        await proxy.close()
