"""One generation's worker processes: start, stream output, watch exits, stop.

A :class:`WorkerProcesses` starts ``nproc`` processes through a spawner (a pre-warmed fork
server or plain subprocesses), each in its own process session (so a
stop reaches any children they forked), echoes every output line to the agent's own
stdout/stderr with a ``[rank]:`` prefix as torchrun does, and reports through the
callbacks it is given: one call per line, one per start, one per exit. An exit is
reported when the process exits, not when its pipes close (a child it forked, such as a
DataLoader worker, may hold them open for good): its output is then read for at most
:data:`DRAIN_SECONDS` more, until :data:`QUIET_SECONDS` pass without a line, so a crash's
last words arrive before its exit (what it wrote is in its pipes already), and the exit
carries its last :data:`LAST_OUTPUT_LINES` lines (stdout and stderr, oldest first, each
cut to :data:`LAST_OUTPUT_CHARS`). Output that comes later, from such a child, is still
read and reported; a stop also kills what is left of an exited worker's process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from resurge_node_agent.launch.process_state import is_stopped
from resurge_node_agent.launch.spawners import READ_LIMIT, SpawnedProcess, Spawner
from resurge_node_agent.private import worker_base_environment

__all__ = ["WorkerExit", "WorkerProcesses"]

MAX_LINE_CHARS = 4096
# An exited worker's output still in its pipes is read for at most this long before
# its exit is reported: what it wrote is already there, only a child's end can be late.
DRAIN_SECONDS = 0.1
# ... and only while lines keep coming: one quiet interval ends the drain.
QUIET_SECONDS = 0.01
# The last lines an exit carries, and how much of each (the cause of a failure).
LAST_OUTPUT_LINES = 20
LAST_OUTPUT_CHARS = 1000

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class WorkerExit:
    """How one worker ended: an exit code or a signal name, and whether it was told to."""

    local_rank: int
    pid: int
    exit_code: int | None
    signal: str | None
    expected: bool
    last_output: tuple[str, ...] = ()


def _is_stopped(proc: SpawnedProcess) -> bool:
    return proc.returncode is None and is_stopped(proc.pid) is True


class WorkerProcesses:
    """The ``nproc`` worker processes of one generation (one environment each), not the
    replica's worker group, which outlives them."""

    def __init__(
        self,
        command: Sequence[str],
        environments: Sequence[Mapping[str, str]],
        *,
        cwd: str | None,
        on_start: Callable[[int, int], Awaitable[None]],
        on_line: Callable[[int, Stream, str], Awaitable[None]],
        on_exit: Callable[[WorkerExit], Awaitable[None]],
        echo_prefix: Callable[[int], str],
        spawner: Spawner,
    ) -> None:
        self.command = list(command)
        self.environments = [dict(env) for env in environments]
        self.cwd = cwd
        self._on_start = on_start
        self._on_line = on_line
        self._on_exit = on_exit
        self._echo_prefix = echo_prefix
        self._spawner = spawner
        self._procs: dict[int, SpawnedProcess] = {}
        self._watchers: list[asyncio.Task[None]] = []
        self._last: dict[int, deque[str]] = {}
        self._lines_read: dict[int, int] = {}
        # Output pumps still reading after their worker exited (a child holds its pipes).
        self._leftovers: dict[int, asyncio.Future[tuple[None, None]]] = {}
        self._stopping = False

    @property
    def size(self) -> int:
        """How many workers (one per environment)."""
        return len(self.environments)

    def pid_of(self, local_rank: int) -> int | None:
        """Process id of a worker that is still running, else None."""
        proc = self._procs.get(local_rank)
        return proc.pid if proc is not None and proc.returncode is None else None

    async def emit_line(self, local_rank: int, stream: Stream, line: str) -> None:
        """Report ``line`` as if worker ``local_rank`` had printed it (fault injection),
        and write it to the worker's output as its own lines are (the agent's log)."""
        self._echo(local_rank, stream, line)
        self._remember(local_rank, line)
        await self._on_line(local_rank, stream, line[:MAX_LINE_CHARS])

    def _remember(self, local_rank: int, line: str) -> None:
        last = self._last.setdefault(local_rank, deque(maxlen=LAST_OUTPUT_LINES))
        last.append(line[:LAST_OUTPUT_CHARS])
        self._lines_read[local_rank] = self._lines_read.get(local_rank, 0) + 1

    def _echo(self, local_rank: int, stream: Stream, line: str) -> None:
        echo = sys.stdout if stream == "stdout" else sys.stderr
        echo.write(f"{self._echo_prefix(local_rank)}{line}\n")
        echo.flush()

    def running_pids(self) -> dict[int, int]:
        """Local rank -> pid of every worker still running."""
        return {r: p.pid for r, p in self._procs.items() if p.returncode is None}

    @property
    def running(self) -> bool:
        """Whether any worker is still running."""
        return any(proc.returncode is None for proc in self._procs.values())

    async def start(self) -> None:
        """Spawn every worker, then report each start and begin watching it."""
        for local_rank, extra in enumerate(self.environments):
            env = worker_base_environment(os.environ)  # never the agent's NATS user
            proc = await self._spawner.spawn(self.command, {**env, **extra}, self.cwd)
            self._procs[local_rank] = proc
        for local_rank, proc in self._procs.items():
            await self._on_start(local_rank, proc.pid)
            self._watchers.append(asyncio.create_task(self._watch(local_rank, proc)))

    async def wait(self) -> None:
        """Until every worker has exited and been reported. Cancelling the wait leaves
        the watchers running: a service that cancels its tasks as it stops still reports
        the exits of the workers it then stops."""
        if self._watchers:
            await asyncio.wait(self._watchers)

    async def stop(self, grace_seconds: float, kill_now: Collection[int] = ()) -> None:
        """Stop every worker: SIGKILL at once for the local ranks in ``kill_now`` and for
        any worker that is stopped (state T: it cannot act on SIGTERM), SIGTERM for the
        rest, and SIGKILL for what is left after ``grace_seconds`` (0: no grace). The
        grace ends as soon as every worker has exited; a worker stopped during it is
        killed then."""
        self._stopping = True
        killed = set(kill_now) | {r for r, p in self._procs.items() if _is_stopped(p)}
        if grace_seconds <= 0:
            killed = set(self._procs)
        self._signal(killed, signal.SIGKILL)
        self._signal(set(self._procs) - killed, signal.SIGTERM)
        self.kill_leftovers()
        if not self._watchers:
            return
        # asyncio.wait, not wait_for: a timeout must not cancel the watchers, which
        # still have to report each exit.
        deadline = asyncio.get_running_loop().time() + grace_seconds
        while True:
            left = deadline - asyncio.get_running_loop().time()
            _, pending = await asyncio.wait(self._watchers, timeout=min(max(left, 0), 0.2))
            if not pending:
                return
            if left <= 0:
                break
            stopped = {r for r, p in self._procs.items() if r not in killed and _is_stopped(p)}
            self._signal(stopped, signal.SIGKILL)
            killed |= stopped
        self._signal_all(signal.SIGKILL)
        await self.wait()

    def _signal(self, local_ranks: Collection[int], signum: signal.Signals) -> None:
        for local_rank in local_ranks:
            proc = self._procs.get(local_rank)
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signum)

    def _signal_all(self, signum: signal.Signals) -> None:
        for proc in self._procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signum)

    def kill_leftovers(self) -> None:
        """SIGKILL the process group of each exited worker whose pipes are still open: a
        child it forked is left (its pid names the group while any member lives)."""
        for local_rank, pumps in self._leftovers.items():
            if not pumps.done():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._procs[local_rank].pid, signal.SIGKILL)

    async def _watch(self, local_rank: int, proc: SpawnedProcess) -> None:
        pumps = asyncio.gather(
            self._pump(local_rank, "stdout", proc.stdout),
            self._pump(local_rank, "stderr", proc.stderr),
        )
        code = await proc.wait()
        await self._drain(local_rank, pumps)
        if not pumps.done():
            self._leftovers[local_rank] = pumps
            if self._stopping:
                self.kill_leftovers()
        expected = self._stopping
        last = tuple(self._last.get(local_rank, ()))
        if code < 0:
            name = signal.Signals(-code).name
            exit_ = WorkerExit(local_rank, proc.pid, None, name, expected, last)
        else:
            exit_ = WorkerExit(local_rank, proc.pid, code, None, expected, last)
        await self._on_exit(exit_)

    async def _drain(self, local_rank: int, pumps: asyncio.Future[tuple[None, None]]) -> None:
        """Read an exited worker's pipes until they close, or no line came for
        :data:`QUIET_SECONDS`, or :data:`DRAIN_SECONDS` passed. A pipe already readable
        is read before a timer of the same loop turn fires, so what the worker wrote
        before it exited is read even when the agent was not scheduled for a while."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_SECONDS
        while (left := deadline - loop.time()) > 0:
            read = self._lines_read.get(local_rank, 0)
            # asyncio.wait, not wait_for: pumps still reading go on (a child's output).
            done, _ = await asyncio.wait([pumps], timeout=min(QUIET_SECONDS, left))
            if done or self._lines_read.get(local_rank, 0) == read:
                return

    async def _pump(self, local_rank: int, name: Stream, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                raw = await reader.readline()
            except ValueError:  # a line longer than the read limit: take what is there
                raw = await reader.read(READ_LIMIT)
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self._echo(local_rank, name, line)
            self._remember(local_rank, line)
            await self._on_line(local_rank, name, line[:MAX_LINE_CHARS])
