"""A real node monitor (``resurge-node-agent monitor``) run as a process for a test,
with simulated GPUs even on a machine with real ones (tests inject XIDs into them)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from resurge.runtime.settings import Settings
from resurge_node_agent.monitor.gpus import SIMULATE_GPUS


def cli_env(settings: Settings) -> dict[str, str]:
    """This environment, pointed at the test's NATS server and namespace."""
    return {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_LOG_FORMAT": "text",
    }


@asynccontextmanager
async def running_monitor(
    settings: Settings, tmp_path: Path, *args: str, stop_seconds: float
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Node ``n1`` with 2 GPUs (plus ``args``); stopped at the end, its log printed (shown
    when the test fails)."""
    log_path = tmp_path / "monitor.log"
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "resurge_node_agent", "monitor"),
            *("--node", "n1", "--gpus", "2", *args),
            env={**cli_env(settings), SIMULATE_GPUS: "1"},
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), stop_seconds)
        except TimeoutError:
            process.kill()
            await process.wait()
        print(log_path.read_text())
