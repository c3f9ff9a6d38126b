"""Streams of three copies on a NATS cluster that is still forming: while fewer servers
than copies have joined, JetStream answers "no suitable peers for placement" (400,
10005); the bus asks again until the servers are there, as it does while a cluster
elects its leaders. Before, the bus read that 400 as "the stream exists with another
configuration", asked to update it, got "stream not found" (404) and gave up: a
three-server local cluster failed to start now and then on a loaded machine."""

from __future__ import annotations

import asyncio
from pathlib import Path

from resurge.local.nats_server import cluster_of
from resurge.runtime.bus import Bus, until_jetstream
from resurge.runtime.settings import Settings

# Long enough for the old bus to have failed (at its first answer, in milliseconds).
STILL_WAITING_AFTER_SECONDS = 2.0


async def test_streams_of_three_copies_wait_for_the_third_server(tmp_path: Path) -> None:
    servers = cluster_of(tmp_path, 3, None, "nats")
    try:
        for server in servers[:2]:  # a quorum: JetStream runs, but 2 peers for 3 copies
            server.start()
        settings = Settings(nats_url=servers[0].url, namespace="placement", stream_replicas=3)
        bus = await Bus.connect(settings, "test")
        try:
            await until_jetstream(bus.js.account_info)  # its leaders elected: it answers
            ensuring = asyncio.create_task(bus.ensure_streams())
            done, _ = await asyncio.wait({ensuring}, timeout=STILL_WAITING_AFTER_SECONDS)
            assert not done, f"gave up with two servers of three: {ensuring.exception()!r}"

            await asyncio.to_thread(servers[2].start)
            await asyncio.wait_for(ensuring, 60)
            info = await bus.js.stream_info(bus.subjects.stream("action"))
            assert info.config.num_replicas == 3
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        finally:
            await bus.close()
    finally:
        for server in servers:
            server.stop()
