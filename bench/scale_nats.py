"""A NATS for the scale curves: one server or a cluster of three, and its idle baselines.

:func:`nats_of` starts ``servers`` embedded nats-servers with JetStream in a folder
(more than one: a cluster on loopback, :func:`resurge.local.nats_server.cluster_of`),
waits until JetStream answers, and yields a :class:`Nats`: the URL list clients are
given, the copies each stream and bucket gets (1, or 3 on the cluster, as ``resurge up
--nats-cluster 3`` gives them: ``RESURGE_STREAM_REPLICAS``), and the environment a
service process needs. The servers are stopped on the way out.

The baselines every figure is divided by are measured on it by
:mod:`idle_baselines` (``nats.settings(...)``), as bench/restart_latency.py measures
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from resurge.local.nats_server import NatsServer, cluster_of
from resurge.runtime.bus import Bus, until_jetstream
from resurge.runtime.settings import Settings

__all__ = ["Nats", "nats_of"]


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
