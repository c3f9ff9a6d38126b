"""A user added while a local cluster runs is taken in by every server of a NATS
cluster, not only by a lone server: each member reloads its config (SIGHUP) and accepts
the new user. Before, a member's name was a command-line flag, and the reload of a
JetStream cluster member failed ("jetstream cluster requires `server_name` to be set"),
so a launch agent's user of its job (or a node added by `resurge node add`) was refused
by every server for good."""

from __future__ import annotations

import asyncio
from pathlib import Path

from resurge.contract.subjects import Subjects
from resurge.local.access import LocalAccess
from resurge.local.nats_server import cluster_of
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings


async def accepted(url: str, credentials: Path, seconds: float = 10.0) -> bool:
    """Whether ``url`` lets the user of ``credentials`` on within ``seconds``."""
    settings = Settings(nats_url=url, nats_credentials=credentials, connect_timeout_seconds=2)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        try:
            bus = await Bus.connect(settings, "test", connect_timeout=1.0)
        except ConnectionError:
            await asyncio.sleep(0.1)  # another process's config reload: polled, bounded
            continue
        await bus.close()
        return True
    return False


async def test_every_member_of_a_cluster_takes_a_user_added_at_run_time(tmp_path: Path) -> None:
    access = LocalAccess(tmp_path / "state", Subjects("reload"))
    access.prepare(["node-0"])
    config = access.write_config(["node-0"])
    servers = cluster_of(tmp_path / "state" / "nats", 3, config, "nats")
    try:
        for server in servers:
            server.start()
        access.add_job_agent("node-0", "team-a")
        access.write_config(["node-0"])
        for server in servers:
            server.reload()
        credentials = access.job_agent_file("node-0", "team-a")
        for server in servers:
            assert await accepted(server.url, credentials), server.log_path.read_text()[-2000:]
    finally:
        for server in servers:
            server.stop()
