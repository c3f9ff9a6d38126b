"""``resurge nats-identities`` against a real nats-server: what it writes boots a server
in operator mode that its role users can work on, with files only their owner reads."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from resurge.local.nats_server import NatsServer
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

BIN = Path(sys.executable).parent


async def test_what_it_writes_runs_a_server_its_role_users_can_use(tmp_path: Path) -> None:
    out = tmp_path / "ids"
    done = await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "resurge"), "nats-identities", "--out", str(out), "--namespace", "tids"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in out.iterdir())
    roles = ["admin", "agent", "detector", "restarter", "scaler", "viewer"]
    expected = ["account-signer.seed", "account.pub", "nats-operator.conf"]
    assert written == sorted(expected + [f"{r}.creds" for r in roles])
    assert all(p.stat().st_mode & 0o077 == 0 for p in out.iterdir())
    assert (out / "account-signer.seed").read_text().startswith("SA")

    with NatsServer(tmp_path / "nats", config=out / "nats-operator.conf") as server:
        settings = Settings(
            nats_url=server.url,
            namespace="tids",
            nats_credentials=out / "scaler.creds",
            connect_timeout_seconds=10,
        )
        bus = await Bus.connect(settings, "scaler")
        try:
            await bus.ensure_streams()  # the scaler's user manages the streams
        finally:
            await bus.close()


def test_it_refuses_a_folder_that_exists(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "resurge"), "nats-identities", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "exists" in done.stderr
