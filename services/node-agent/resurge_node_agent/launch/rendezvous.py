"""The rendezvous store the agent of rank 0's replica hosts for one generation.

As torchrun's elastic agent does (``TORCHELASTIC_USE_AGENT_STORE``), the agent whose
replica holds rank 0 hosts each generation's c10d ``TCPStore`` at that generation's
``MASTER_PORT``, so every worker, rank 0 included, connects to it as a client and a
plain ``init_process_group("gloo"|"nccl")`` script needs nothing more; the store's
clients joining is a sign of life that needs nothing from the script.

The agent itself never imports torch. :meth:`HostedStore.prepare` starts
:mod:`resurge_node_agent.launch.rendezvous_store` through the agent's spawner (forked from the
fork server, which has torch imported) as a warmed-up standby, ahead of the generation
it will serve; :meth:`HostedStore.host` gives it the generation's port and world size
through a named pipe, and :meth:`HostedStore.listening` waits until it accepts
connections (the agent starts its workers then, so no client backs off against a store
not yet up; from a standby that takes a millisecond or two, from a fresh fork tens).
``on_joined`` is called once, when all ``world_size`` ranks' clients have joined.
:meth:`HostedStore.close` kills it (a new generation gets a new store on a new port).
What it writes on stderr goes to the agent's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from resurge_node_agent.launch.rendezvous_store import JOINED, LISTENING, STANDBY
from resurge_node_agent.launch.spawners import SpawnedProcess, Spawner

__all__ = ["STORE_MODULE", "HostedStore"]

STORE_MODULE = "resurge_node_agent.launch.rendezvous_store"
# How often the pipe is tried while the standby, which said it is ready, opens it.
_OPEN_RETRY_SECONDS = 0.0005


class HostedStore:
    """One store process, as the agent sees it: a standby until :meth:`host`."""

    def __init__(self, process: SpawnedProcess, fifo: Path, log: logging.Logger) -> None:
        self.port: int | None = None
        self._process = process
        self._fifo = fifo
        self._log = log
        self._on_joined: Callable[[], Awaitable[None]] | None = None
        loop = asyncio.get_running_loop()
        self._standby: asyncio.Future[bool] = loop.create_future()
        self._listening: asyncio.Future[bool] = loop.create_future()
        self._readers = [
            asyncio.create_task(self._read_stdout(), name=f"store-{process.pid}-stdout"),
            asyncio.create_task(self._read_stderr(), name=f"store-{process.pid}-stderr"),
        ]

    @classmethod
    async def prepare(
        cls, spawner: Spawner, env: Mapping[str, str], folder: Path, log: logging.Logger
    ) -> HostedStore:
        """Start a standby store process; its named pipe goes in ``folder``."""
        fifo = folder / f"store-{uuid.uuid4().hex}"
        os.mkfifo(fifo, 0o600)
        try:
            argv = [sys.executable, "-m", STORE_MODULE, str(fifo)]
            process = await spawner.spawn(argv, env, None)
        except BaseException:
            fifo.unlink(missing_ok=True)
            raise
        return cls(process, fifo, log)

    async def host(
        self, port: int, world_size: int, on_joined: Callable[[], Awaitable[None]]
    ) -> bool:
        """Serve ``world_size`` ranks on ``port``; False if the standby is gone."""
        self.port, self._on_joined = port, on_joined
        try:
            if not await self._standby:
                return False
            while True:
                try:
                    fd = os.open(self._fifo, os.O_WRONLY | os.O_NONBLOCK)
                    break
                except OSError as error:  # ENXIO: it said standby and opens the pipe now
                    if error.errno != errno.ENXIO or self._process.returncode is not None:
                        return False
                    await asyncio.sleep(_OPEN_RETRY_SECONDS)
            try:
                os.write(fd, f"{port} {world_size}\n".encode())
            finally:
                os.close(fd)
            return True
        finally:
            self._fifo.unlink(missing_ok=True)

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
        self._fifo.unlink(missing_ok=True)

    async def _read_stdout(self) -> None:
        try:
            while line := (await self._process.stdout.readline()).decode(errors="replace"):
                said = line.strip()
                if said == STANDBY and not self._standby.done():
                    self._standby.set_result(True)
                elif said == LISTENING and not self._listening.done():
                    self._listening.set_result(True)
                elif said == JOINED and self._on_joined is not None:
                    await self._on_joined()
        finally:
            for future in (self._standby, self._listening):
                if not future.done():
                    future.set_result(False)

    async def _read_stderr(self) -> None:
        while line := (await self._process.stderr.readline()).decode(errors="replace"):
            self._log.warning("rendezvous store (port %s): %s", self.port, line.rstrip())
