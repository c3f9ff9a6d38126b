"""How the agent starts a worker process: the :class:`Spawner` interface and plain subprocesses.

A spawner starts ``argv`` with exactly the environment ``env`` (the caller merges
``os.environ`` in itself) in ``cwd``, with stdin on /dev/null and stdout/stderr on pipes
the agent reads as :class:`asyncio.StreamReader` (lines up to :data:`READ_LIMIT`). The
child leads its own session and process group, so ``os.killpg(pid, sig)`` reaches it
and everything it forked, and it is SIGKILLed when the agent dies, however the agent
dies (:mod:`resurge_node_agent.launch.parent_death`). ``wait()`` returns once the process
itself has exited, even while a child it forked still holds its stdout or stderr open
(a DataLoader worker does), with asyncio's return code: the exit status, or the
negative signal number when a signal ended the process.

``close()`` ends what the spawner still runs: a process that has not exited gets SIGKILL
on its process group and is waited for. Stop workers gracefully before closing.

:class:`PlainSpawner` is ``asyncio.create_subprocess_exec``; the fork server in
:mod:`resurge_node_agent.launch.forkserver` is the other implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Protocol

from resurge_node_agent.launch.parent_death import die_with_parent

__all__ = ["READ_LIMIT", "PlainSpawner", "SpawnedProcess", "Spawner"]

# Longest output line a StreamReader returns from readline().
READ_LIMIT = 1 << 20
# How often a process known to have exited is checked for its return code: asyncio's
# child watcher reaps it within a loop turn or two.
_REAP_POLL_SECONDS = 0.001


class SpawnedProcess(Protocol):
    """A started worker: its pid, its output pipes and its exit code."""

    @property
    def pid(self) -> int:
        """The process id, which also names its session and process group."""

    @property
    def stdout(self) -> asyncio.StreamReader:
        """The worker's standard output."""

    @property
    def stderr(self) -> asyncio.StreamReader:
        """The worker's standard error."""

    @property
    def returncode(self) -> int | None:
        """The return code once it has exited, else None."""

    async def wait(self) -> int:
        """Wait for it to exit (not for its pipes to close) and return its return code."""


class Spawner(Protocol):
    """Starts worker processes and ends the ones still running when closed."""

    async def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None
    ) -> SpawnedProcess:
        """Start ``argv`` with exactly ``env`` in ``cwd``."""

    async def close(self) -> None:
        """SIGKILL the process group of every process still running and wait for it."""


class PlainProcess:
    """An :class:`asyncio.subprocess.Process` seen as a :class:`SpawnedProcess`."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None and process.stderr is not None
        self._process = process
        self._stdout = process.stdout
        self._stderr = process.stderr

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def stdout(self) -> asyncio.StreamReader:
        return self._stdout

    @property
    def stderr(self) -> asyncio.StreamReader:
        return self._stderr

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        # asyncio's own wait() also waits for the pipes to close, which a child the
        # worker forked may put off for good: watch the process itself (a pidfd).
        process = self._process
        if process.returncode is not None:
            return process.returncode
        try:
            pidfd = os.pidfd_open(process.pid)
        except OSError:  # already reaped (its return code is on its way), or no pidfds
            return await process.wait()
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, wake)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        # asyncio's child watcher reaps it and hands the return code to the loop.
        while process.returncode is None:  # noqa: ASYNC110 (no event says it was reaped)
            await asyncio.sleep(_REAP_POLL_SECONDS)
        return process.returncode


class PlainSpawner:
    """A new interpreter (or any program) per worker, as the agent has always started them."""

    def __init__(self) -> None:
        self._processes: list[PlainProcess] = []

    async def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None
    ) -> PlainProcess:
        """Start ``argv`` as a new process."""
        agent = os.getpid()
        process = await asyncio.create_subprocess_exec(
            *argv,
            preexec_fn=lambda: die_with_parent(agent),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            limit=READ_LIMIT,
        )
        self._processes = [p for p in self._processes if p.returncode is None]
        spawned = PlainProcess(process)
        self._processes.append(spawned)
        return spawned

    async def close(self) -> None:
        """Kill every worker still running and wait for it."""
        running = [p for p in self._processes if p.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        await asyncio.gather(*(p.wait() for p in running))
        self._processes.clear()
