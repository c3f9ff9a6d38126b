"""A launch agent's unix socket for the reports of workers that use ``resurge.worker``.

One :class:`WorkerChannel` per launch agent, for all its generations::

    channel = WorkerChannel(socket_path_for(job, replica), on_progress, on_checkpoint)
    await channel.start()            # listening; give workers RESURGE_AGENT_SOCKET=channel.path
    await channel.notify_stop_pending(generation, "resize")   # before stopping them
    await channel.close()            # drops connections, removes the socket file

The wire protocol is :mod:`resurge.worker.wire`. Each connection says ``hello``
first; its ``local_rank`` is passed to the callbacks for the reports that follow:
``await on_progress(local_rank, step, metrics)`` and ``await on_checkpoint(local_rank,
step, path)``, in order per connection (a slow callback slows only that worker's
reports, which then queue in the worker, never blocking its training). A callback that
raises is logged and the connection goes on.

Instead of those two, ``on_report=`` takes every report of the whole protocol (progress,
checkpoint, fault, rejoining) as ``await on_report(hello, report)``, where ``hello``
is the sender's, kept current: a ``rejoining`` worker's generation and rank are
updated before the callback (and for everything after). ``worker(local_rank, pid)``
finds a connected worker's hello; ``send(local_rank, line, pid=...)`` queues an
agent-to-worker line (``restart``, ``raise``) on its connection.

A line that breaks the protocol is rejected and never closes anything: ``rejected``
counts rejections by reason (:data:`~resurge.worker.wire.REJECT_REASONS`), and
each reason is logged at most once a minute. A connection's last line may lack its
newline.

No client can crash or stall the channel for others. The socket lives in a private
folder (mode 0700, made by :meth:`WorkerChannel.start` and removed by ``close``) and
is itself 0600, so only this user's processes connect at all. Each connection is
served by its own task, reads at most :data:`~resurge.worker.wire.MAX_LINE_BYTES` of
one line (longer ones are dropped as ``too_long``), and is closed, counted under
``rejected``, when it: has not said hello within ``hello_timeout`` seconds
(``hello_timeout``: a silent or half-written hello), would be one more than
``max_connections`` (``too_many_connections``), or does not read what the agent sends
it until more than :data:`MAX_WRITE_BACKLOG_BYTES` wait (``write_backlog``).

``notify_stop_pending(g, reason)`` sends ``stop_pending`` to every connected worker of
generation g or older, and remembers it: a worker of such a generation that says
hello later (started late, or reconnected) gets it then.

``request_checkpoint(g, reason, hold_seconds)`` sends ``checkpoint_now`` to every
connected worker of generation g (exactly) and returns their local ranks; a request is
not remembered
for workers that connect later.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import stat
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from resurge.runtime.logs import RateLimitedLog
from resurge.worker.wire import (
    MAX_LINE_BYTES,
    CheckpointReport,
    FaultReport,
    Hello,
    ProgressReport,
    ProtocolError,
    Rejoining,
    RestoreReport,
    checkpoint_now_line,
    parse_worker_message,
    stop_pending_line,
)

__all__ = [
    "HELLO_TIMEOUT_SECONDS",
    "MAX_CONNECTIONS",
    "MAX_WRITE_BACKLOG_BYTES",
    "SOCKET_PATH_MAX_BYTES",
    "CheckpointCallback",
    "ProgressCallback",
    "Report",
    "ReportCallback",
    "WorkerChannel",
    "socket_path_for",
]

# Linux keeps a unix socket's path in 108 bytes, its terminating NUL included.
SOCKET_PATH_MAX_BYTES = 107
_READ_CHUNK = 64 * 1024
_CLOSE_WAIT_SECONDS = 5.0
# A worker says hello as soon as it connects; a connection silent that long is not one.
HELLO_TIMEOUT_SECONDS = 10.0
# Far more than the workers of one agent (one per GPU, plus a reconnect each).
MAX_CONNECTIONS = 256
# Agent-to-worker lines waiting for a worker that does not read: a live worker's link
# thread reads at once, so this much pending means it is gone or hostile.
MAX_WRITE_BACKLOG_BYTES = 1024 * 1024

ProgressCallback = Callable[[int, int, dict[str, float]], Awaitable[None]]
CheckpointCallback = Callable[[int, int, str], Awaitable[None]]
Report = ProgressReport | CheckpointReport | FaultReport | Rejoining | RestoreReport
ReportCallback = Callable[[Hello, Report], Awaitable[None]]

log = logging.getLogger(__name__)


def socket_path_for(job: str, replica: int) -> str:
    """A new, short socket path for ``job``'s ``replica`` in the temporary folder.

    ``resurge-<hash of job>-<replica>-<random>/agent.sock``: the hash keeps any job
    name short, the random part keeps two agents of a same-named job apart (two local
    clusters, parallel tests). The folder is made private by
    :meth:`WorkerChannel.start`. Call it once per agent and pass the path on.
    """
    digest = hashlib.sha256(job.encode()).hexdigest()[:12]
    folder = f"resurge-{digest}-{replica}-{secrets.token_hex(4)}"
    path = str(Path(tempfile.gettempdir()) / folder / "agent.sock")
    _check_length(path)
    return path


def _check_length(path: str) -> None:
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_MAX_BYTES:
        raise ValueError(
            f"unix socket path {path!r} is {size} bytes; at most {SOCKET_PATH_MAX_BYTES} fit "
            "(set TMPDIR to a shorter folder)"
        )


def _restrict(path: str) -> None:
    """Let only this user (its workers) connect: a local, instant call."""
    Path(path).chmod(0o600)


def _private_folder(folder: Path) -> bool:
    """Make ``folder`` (mode 0700), or check an existing one is this user's alone;
    True when it was made here. Local, instant calls."""
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise PermissionError(
                f"the worker socket's folder {folder} is not a folder of this user"
            ) from None
        if info.st_mode & 0o077:
            raise PermissionError(
                f"the worker socket's folder {folder} is open to other users "
                f"(mode {stat.S_IMODE(info.st_mode):o}); it must be private (700)"
            ) from None
        return False
    folder.chmod(0o700)  # whatever the umask took away or left
    return True


def _remove(path: str, folder: Path | None) -> None:
    Path(path).unlink(missing_ok=True)
    if folder is not None:
        with contextlib.suppress(OSError):  # not empty: someone else's files, kept
            folder.rmdir()


class _Lines:
    """Splits a byte stream into lines, dropping (and counting) those over the limit."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skipping = False  # inside a line already found too long

    def feed(self, chunk: bytes) -> tuple[list[bytes], int]:
        """Complete lines in ``chunk`` (without newlines), and how many were too long."""
        self._buffer.extend(chunk)
        lines: list[bytes] = []
        too_long = 0
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if self._skipping:
                self._skipping = False
            elif end + 1 > MAX_LINE_BYTES:
                too_long += 1
            else:
                lines.append(line)
        if len(self._buffer) >= MAX_LINE_BYTES:
            too_long += not self._skipping
            self._skipping = True
            self._buffer.clear()
        return lines, too_long

    def end(self) -> bytes | None:
        """The unterminated last line, if any."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return None if self._skipping or not rest.strip() else rest


class _Connection:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.hello: Hello | None = None


class WorkerChannel:
    """The socket one launch agent's workers report to, across all its generations."""

    def __init__(
        self,
        path: str,
        on_progress: ProgressCallback | None = None,
        on_checkpoint: CheckpointCallback | None = None,
        *,
        on_report: ReportCallback | None = None,
        logger: logging.Logger | None = None,
        hello_timeout: float = HELLO_TIMEOUT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.path = path
        self.hello_timeout = hello_timeout
        self.max_connections = max_connections
        self.rejected: dict[str, int] = {}
        self._on_progress = on_progress
        self._on_checkpoint = on_checkpoint
        self._on_report = on_report
        self._log = logger or log
        self._rate_limited = RateLimitedLog(self._log, interval=60.0)
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        self._stop_notice: tuple[int, bytes] | None = None
        self._closing = False
        self._folder: Path | None = None  # the private folder start() made

    @property
    def workers(self) -> list[Hello]:
        """The hello of every connected worker that has said one."""
        return [c.hello for c in self._connections.values() if c.hello is not None]

    def worker(self, local_rank: int, pid: int | None = None) -> Hello | None:
        """The hello of the connected worker ``local_rank`` (with process id ``pid``)."""
        connection = self._find(local_rank, pid)
        return None if connection is None else connection.hello

    def send(self, local_rank: int, line: bytes, *, pid: int | None = None) -> bool:
        """Queue ``line`` to worker ``local_rank`` (``pid``); False if not connected."""
        connection = self._find(local_rank, pid)
        return connection is not None and bool(self._write(connection, line))

    def _find(self, local_rank: int, pid: int | None) -> _Connection | None:
        for connection in reversed(list(self._connections.values())):  # newest first
            hello = connection.hello
            if (
                hello is not None
                and hello.local_rank == local_rank
                and (pid is None or hello.pid == pid)
                and not connection.writer.is_closing()
            ):
                return connection
        return None

    @property
    def connections(self) -> int:
        """Connections open now (said hello or not)."""
        return len(self._connections)

    async def start(self) -> None:
        """Listen on ``path`` (replacing a stale socket there) in a private folder (made
        if missing, refused if others may enter it), the socket for this user only."""
        _check_length(self.path)
        folder = Path(self.path).parent
        if _private_folder(folder):
            self._folder = folder
        self._server = await asyncio.start_unix_server(
            self._accept, path=self.path, limit=_READ_CHUNK
        )
        _restrict(self.path)

    async def close(self) -> None:
        """Stop listening, close every connection, remove the socket file; idempotent."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for connection in self._connections.values():
            connection.writer.close()
        if self._connections:
            _, late = await asyncio.wait(self._connections, timeout=_CLOSE_WAIT_SECONDS)
            for task in late:  # a callback that does not return
                task.cancel()
            if late:
                await asyncio.wait(late)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
            _remove(self.path, self._folder)
            self._folder = None

    async def notify_stop_pending(self, generation: int, reason: str) -> int:
        """Tell workers of ``generation`` or older that a stop is coming; returns how many.

        The line is queued on each connection without waiting for it to be written.
        """
        line = stop_pending_line(generation, reason)
        self._stop_notice = (generation, line)
        sent = 0
        for connection in self._connections.values():
            if connection.hello is not None and connection.hello.generation <= generation:
                sent += self._write(connection, line)
        return sent

    def request_checkpoint(
        self, generation: int, reason: str, hold_seconds: float = 0.0
    ) -> list[int]:
        """Ask the connected workers of ``generation`` for a checkpoint now (and to hold
        after it for at most ``hold_seconds``, when above 0); the local ranks it was sent
        to (queued, not waited for), in order."""
        line = checkpoint_now_line(generation, reason, hold_seconds)
        asked: set[int] = set()
        for connection in self._connections.values():
            hello = connection.hello
            if (
                hello is not None
                and hello.generation == generation
                and self._write(connection, line)
            ):
                asked.add(hello.local_rank)
        return sorted(asked)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain function, so the task is known from the moment the connection is.
        connection = _Connection(writer)
        if len(self._connections) >= self.max_connections or self._closing:
            writer.close()
            self._reject(connection, "too_many_connections", f"over {self.max_connections}")
            return
        task = asyncio.create_task(self._serve(reader, connection))
        self._connections[task] = connection
        task.add_done_callback(self._connections.pop)

    async def _serve(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        lines = _Lines()
        loop = asyncio.get_running_loop()
        hello_by = loop.time() + self.hello_timeout
        try:
            while not self._closing:
                if connection.hello is None:
                    try:
                        async with asyncio.timeout_at(hello_by):
                            chunk = await reader.read(_READ_CHUNK)
                    except TimeoutError:
                        self._reject(
                            connection, "hello_timeout", f"no hello in {self.hello_timeout} s"
                        )
                        return
                else:
                    chunk = await reader.read(_READ_CHUNK)
                if not chunk:
                    last = lines.end()
                    if last is not None:
                        await self._handle(connection, last)
                    return
                complete, too_long = lines.feed(chunk)
                for _ in range(too_long):
                    self._reject(connection, "too_long", f"a line over {MAX_LINE_BYTES} bytes")
                for line in complete:
                    if line.strip():
                        await self._handle(connection, line)
        except ConnectionError:
            return
        finally:
            connection.writer.close()

    async def _handle(self, connection: _Connection, line: bytes) -> None:
        try:
            message = parse_worker_message(line)
            if isinstance(message, Hello):
                self._greet(connection, message)
                return
            if connection.hello is None:
                raise ProtocolError("no_hello", f"a {type(message).__name__} before hello")
        except ProtocolError as error:
            self._reject(connection, error.reason, error.detail)
            return
        if isinstance(message, Rejoining):
            connection.hello = replace(
                connection.hello, generation=message.generation, rank=message.rank
            )
        await self._deliver(connection.hello, message)

    def _greet(self, connection: _Connection, hello: Hello) -> None:
        if connection.hello is not None:
            raise ProtocolError("repeated_hello", "a second hello on one connection")
        connection.hello = hello
        if self._stop_notice is not None and hello.generation <= self._stop_notice[0]:
            self._write(connection, self._stop_notice[1])

    async def _deliver(self, hello: Hello, message: Report) -> None:
        try:
            if self._on_report is not None:
                await self._on_report(hello, message)
            elif isinstance(message, CheckpointReport) and self._on_checkpoint is not None:
                await self._on_checkpoint(hello.local_rank, message.step, message.path)
            elif isinstance(message, ProgressReport) and self._on_progress is not None:
                await self._on_progress(hello.local_rank, message.step, message.metrics)
        except Exception as error:
            self._rate_limited.warning(
                f"callback:{type(message).__name__}",
                f"handling a worker's {type(message).__name__} failed: {error!r}",
                rank=hello.rank,
            )

    def _write(self, connection: _Connection, line: bytes) -> int:
        writer = connection.writer
        with contextlib.suppress(ConnectionError, RuntimeError):
            if writer.is_closing():
                return 0
            if writer.transport.get_write_buffer_size() + len(line) > MAX_WRITE_BACKLOG_BYTES:
                self._reject(
                    connection,
                    "write_backlog",
                    f"the worker left over {MAX_WRITE_BACKLOG_BYTES} bytes unread",
                )
                writer.transport.abort()  # its reader ends; the worker may reconnect
                return 0
            writer.write(line)
            return 1
        return 0

    def _reject(self, connection: _Connection, reason: str, detail: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        rank = connection.hello.rank if connection.hello else None
        self._rate_limited.warning(
            reason, f"rejected a worker message ({reason}): {detail}", reason=reason, rank=rank
        )
