"""A NATS for the scale curves: one server or a cluster of three, and its idle baselines.

:func:`nats_of` starts ``servers`` embedded nats-servers with JetStream in a folder
(more than one: a cluster on loopback, :func:`resurge.local.nats_server.cluster_of`),
waits until JetStream answers, and yields a :class:`Nats`: the URL list clients are
given, the copies each stream and bucket gets (1, or 3 on the cluster, as ``resurge up
--nats-cluster 3`` gives them: ``RESURGE_STREAM_REPLICAS``), and the environment a
service process needs. The servers are stopped on the way out.

The baselines every figure is divided by, since this machine is shared and noisy:
:func:`one_hop_seconds`, the median of a JetStream publish -> durable push consumer
delivery in one process, and :func:`idle_round_trip_seconds`, the median of a core
message to another process and back, sent 10 ms apart so both sides are idle in
between (as bench/restart_latency.py measures them). Run as a script with
``--echo URL`` this module is that other process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from nats.aio.msg import Msg

from resurge.events import FaultDetected, FaultScope
from resurge.local.nats_server import NatsServer, cluster_of
from resurge.runtime.bus import Bus, until_jetstream
from resurge.runtime.settings import Settings

__all__ = ["Nats", "idle_round_trip_seconds", "nats_of", "one_hop_seconds"]

PING, PONG = "bench.scale.ping", "bench.scale.pong"


@dataclass(frozen=True)
class Nats:
    """A running NATS: its servers, the URLs to give clients, copies per stream."""

    servers: tuple[NatsServer, ...]
    url: str
    stream_replicas: int

    def settings(self, namespace: str) -> Settings:
        return Settings(
            nats_url=self.url, namespace=namespace, stream_replicas=self.stream_replicas
        )

    def env(self, namespace: str) -> dict[str, str]:
        """The environment of a service process on this NATS, in ``namespace``."""
        return {
            **os.environ,
            "RESURGE_NATS_URL": self.url,
            "RESURGE_NAMESPACE": namespace,
            "RESURGE_STREAM_REPLICAS": str(self.stream_replicas),
            "RESURGE_LOG_LEVEL": os.environ.get("BENCH_SERVICE_LOG_LEVEL", "WARNING"),
            "RESURGE_LOG_FORMAT": "text",
            "OMP_NUM_THREADS": "1",
        }

    def pids(self) -> list[int]:
        return [pid for server in self.servers if (pid := server.pid) is not None]


@contextlib.asynccontextmanager
async def nats_of(servers: int, folder: Path) -> AsyncIterator[Nats]:
    """``servers`` nats-servers (1, or a cluster), JetStream answering, until the end."""
    started = (
        [NatsServer(folder / "nats")]
        if servers == 1
        else cluster_of(folder / "nats", servers, None, "nats")
    )
    try:
        for server in started:
            await asyncio.to_thread(server.start)
        nats = Nats(tuple(started), ",".join(s.url for s in started), min(servers, 3))
        bus = await Bus.connect(nats.settings("benchscale"), "bench")
        try:
            await until_jetstream(bus.js.account_info)
        finally:
            await bus.close()
        yield nats
    finally:
        for server in started:
            await asyncio.to_thread(server.stop)


async def one_hop_seconds(nats: Nats, samples: int = 50) -> float:
    """Median time of one JetStream publish -> durable push consumer delivery."""
    bus = await Bus.connect(nats.settings("benchhop"), "bench")
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
    """Answer every message on PING on PONG until killed (the ``--echo`` mode)."""
    bus = await Bus.connect(Settings(nats_url=url, namespace="benchecho"), "bench")

    async def pong(msg: Msg) -> None:
        await bus.nc.publish(PONG, msg.data)

    await bus.nc.subscribe(PING, cb=pong)
    await bus.nc.flush()
    print("echoing", flush=True)
    await asyncio.Event().wait()
    return 0


async def idle_round_trip_seconds(nats: Nats, samples: int = 100) -> float:
    """Median time of a core message to another process and back, 10 ms apart."""
    echoer = subprocess.Popen(  # noqa: ASYNC220 (started before the timed part)
        [sys.executable, __file__, "--echo", nats.url], stdout=subprocess.PIPE
    )
    assert echoer.stdout is not None
    await asyncio.to_thread(echoer.stdout.readline)  # "echoing"
    bus = await Bus.connect(nats.settings("benchecho"), "bench")
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
    parser = argparse.ArgumentParser(description="the scale curves' echo process")
    parser.add_argument("--echo", required=True)
    sys.exit(asyncio.run(echo(parser.parse_args().echo)))
