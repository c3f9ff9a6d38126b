"""The rendezvous store the agent of rank 0's replica hosts for one generation.

As torchrun's elastic agent does (``TORCHELASTIC_USE_AGENT_STORE``), the agent whose
replica holds rank 0 hosts each generation's c10d ``TCPStore`` at that generation's
``MASTER_PORT``, so every worker, rank 0 included, connects to it as a client and a
plain ``init_process_group("gloo"|"nccl")`` script needs nothing more; the store's
clients joining is a sign of life that needs nothing from the script.

The agent itself never imports torch: :meth:`HostedStore.start` runs
:mod:`resurge_node_agent.rendezvous_store` through the agent's spawner (forked from the
fork server, which has torch imported: a few ms; a new interpreter otherwise).
:meth:`HostedStore.listening` waits until it accepts connections (the agent starts its
workers then, so no client backs off against a store not yet up) and says whether it
does; ``on_joined`` is called once, when all ``world_size`` ranks' clients have joined.
:meth:`HostedStore.close` kills it (a new generation gets a new store on a new port).
What it writes on stderr goes to the agent's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping

from resurge_node_agent.rendezvous_store import JOINED, LISTENING
from resurge_node_agent.spawners import SpawnedProcess, Spawner

__all__ = ["STORE_MODULE", "HostedStore"]

STORE_MODULE = "resurge_node_agent.rendezvous_store"


class HostedStore:
    """One generation's store process, as the agent sees it."""

    def __init__(
        self,
        process: SpawnedProcess,
        port: int,
        on_joined: Callable[[], Awaitable[None]],
        log: logging.Logger,
    ) -> None:
        self.port = port
        self._process = process
        self._on_joined = on_joined
        self._log = log
        self._listening: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._readers = [
            asyncio.create_task(self._read_stdout(), name=f"store-{port}-stdout"),
            asyncio.create_task(self._read_stderr(), name=f"store-{port}-stderr"),
        ]

    @classmethod
    async def start(
        cls,
        spawner: Spawner,
        port: int,
        world_size: int,
        env: Mapping[str, str],
        on_joined: Callable[[], Awaitable[None]],
        log: logging.Logger,
    ) -> HostedStore:
        """Start the store process for ``world_size`` ranks on ``port`` (all interfaces)."""
        argv = [sys.executable, "-m", STORE_MODULE, str(port), str(world_size)]
        process = await spawner.spawn(argv, env, None)
        return cls(process, port, on_joined, log)

    async def listening(self, seconds: float) -> bool:
        """Whether the store accepts connections within ``seconds`` (False if it exited,
        or is not up by then)."""
        done, _ = await asyncio.wait([self._listening], timeout=seconds)
        return bool(done) and self._listening.result()

    async def close(self) -> None:
        """Kill the store process and wait for it."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)
        await self._process.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)

    async def _read_stdout(self) -> None:
        try:
            while line := (await self._process.stdout.readline()).decode(errors="replace"):
                said = line.strip()
                if said == LISTENING and not self._listening.done():
                    self._listening.set_result(True)
                elif said == JOINED:
                    await self._on_joined()
        finally:
            if not self._listening.done():
                self._listening.set_result(False)

    async def _read_stderr(self) -> None:
        while line := (await self._process.stderr.readline()).decode(errors="replace"):
            self._log.warning("rendezvous store on port %d: %s", self.port, line.rstrip())
