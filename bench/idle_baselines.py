"""The idle baselines benches divide their latencies by, measured on the NATS they use.

:func:`one_hop_seconds`: the median of a JetStream publish -> durable push consumer
delivery in one process. :func:`idle_round_trip_seconds`: the median of a core message
to another process and back, 10 ms apart (both processes idle in between, as the
services are before a fault): what waking a process costs on the machine. Run as
``python bench/idle_baselines.py URL``, this module is that other process.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time

from nats.aio.msg import Msg

from resurge.events import FaultDetected, FaultScope
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

__all__ = ["idle_round_trip_seconds", "one_hop_seconds"]

PING, PONG = "bench.idle.ping", "bench.idle.pong"


async def one_hop_seconds(settings: Settings, samples: int = 50) -> float:
    """Median time of one JetStream publish -> durable push consumer delivery."""
    bus = await Bus.connect(settings, "bench")
    try:
        await bus.ensure_streams()
        arrived: asyncio.Queue[float] = asyncio.Queue()

        async def on(_event: FaultDetected) -> None:
            await arrived.put(time.perf_counter())

        await bus.consume(bus.subjects.all("fault"), "hop", on, expects=(FaultDetected,))
        hops = []
        for i in range(samples):
            sent = time.perf_counter()
            fault = FaultDetected(
                source=bus.source, job="j", fault_id=str(i), scope=FaultScope.PROCESS, reason="x"
            )
            await bus.publish(bus.subjects.fault("j", "process"), fault)
            hops.append(await asyncio.wait_for(arrived.get(), 10) - sent)
    finally:
        await bus.close()
    return statistics.median(hops)


async def echo(url: str) -> int:
    """Answer every message on PING on PONG until killed."""
    bus = await Bus.connect(Settings(nats_url=url, namespace="benchecho"), "bench")

    async def pong(msg: Msg) -> None:
        await bus.nc.publish(PONG, msg.data)

    await bus.nc.subscribe(PING, cb=pong)
    await bus.nc.flush()
    print("echoing", flush=True)
    await asyncio.Event().wait()
    return 0


async def idle_round_trip_seconds(settings: Settings, samples: int = 100) -> float:
    """Median time of a core message to another process and back, 10 ms apart."""
    echoer = subprocess.Popen(  # noqa: ASYNC220 (started before the timed part)
        [sys.executable, __file__, settings.nats_url], stdout=subprocess.PIPE
    )
    assert echoer.stdout is not None
    await asyncio.to_thread(echoer.stdout.readline)  # "echoing"
    bus = await Bus.connect(settings, "bench")
    back: asyncio.Queue[float] = asyncio.Queue()

    async def on(_msg: Msg) -> None:
        back.put_nowait(time.perf_counter())

    await bus.nc.subscribe(PONG, cb=on)
    trips = []
    try:
        for _ in range(samples):
            await asyncio.sleep(0.01)  # the idle gap is the point, not a synchronisation
            sent = time.perf_counter()
            await bus.nc.publish(PING, b"x" * 512)
            trips.append(await asyncio.wait_for(back.get(), 10) - sent)
    finally:
        await bus.close()
        echoer.kill()
        echoer.wait()
    return statistics.median(trips)


if __name__ == "__main__":
    sys.exit(asyncio.run(echo(sys.argv[1])))
