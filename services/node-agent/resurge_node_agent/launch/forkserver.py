"""A pre-warmed fork server behind the :class:`~.spawners.Spawner` interface.

``await ForkServerSpawner.start(preload=("torch",))`` starts one server process
(:mod:`resurge_node_agent.launch.forkserver_main`) that imports ``preload`` once; every Python
worker is then forked from it instead of paying for a new interpreter and its imports.
The agent creates each worker's stdout/stderr pipes, passes the write ends (and
/dev/null for stdin) to the server with SCM_RIGHTS, and reads the read ends itself; the
server forks, reaps and reports each exit code back over the same socket.

Which argv are forked (everything else goes to a :class:`PlainSpawner`, unchanged):

- ``argv[0]`` is this interpreter: ``sys.executable`` itself, or ``python``,
  ``python3`` or ``python3.N`` (N this minor version) found in the same folder as
  ``sys.executable`` (through the child's ``PATH``, or relative to ``cwd``). A
  ``python`` from another folder may be another interpreter or virtualenv.
- then any number of ``-u``, then ``-m MODULE``, ``-c CODE`` or ``SCRIPT``, then the
  program's arguments. Any other interpreter flag falls back.
- the environment does not ask for a value the server cannot give by forking: every
  variable the interpreter or a preloaded native library reads once at start
  (:data:`STARTUP_PREFIXES`) must match the server's environment, except
  ``PYTHONUNBUFFERED`` and a positive ``OMP_NUM_THREADS`` (applied with
  ``torch.set_num_threads``), which the child applies itself.

The server dies with the agent and every forked worker with the server (parent-death
signals, :mod:`resurge_node_agent.launch.parent_death`), so no worker outlives its agent.
If the server dies, every worker it had not reported yet gets SIGKILL on its process
group (nobody could reap it or learn its exit status any more) and its ``wait()``
returns ``-SIGKILL`` once it is gone. The next Python spawn starts a new server (paying
the preload once); after ``max_restarts`` such restarts, or if one fails, every later
spawn uses the plain spawner. ``close()`` kills what still runs, then stops the server.
The server starts with the agent's environment less its NATS variables
(:func:`~resurge_node_agent.private.worker_base_environment`): a forked worker's
``/proc/PID/environ`` is the server's, inherited.
Forked siblings share the server's hash seed (``PYTHONHASHSEED``) and numpy's OpenBLAS
thread count; ``random``, ``numpy.random`` and the multiprocessing authkey are reseeded.
Linux only (pidfds, /proc).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import shutil
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from resurge_node_agent.launch.forkserver_main import TITLE_ROOM, decode_frames, encode_frame
from resurge_node_agent.launch.spawners import READ_LIMIT, PlainSpawner, SpawnedProcess
from resurge_node_agent.private import worker_base_environment

__all__ = [
    "STARTUP_PREFIXES",
    "ForkServerError",
    "ForkServerSpawner",
    "ForkedProcess",
    "PythonProgram",
    "python_program",
    "startup_mismatch",
]

log = logging.getLogger(__name__)

SERVER_MODULE = "resurge_node_agent.launch.forkserver_main"
# Variables read once at interpreter or native-library start (locale, sys.path, flags,
# the dynamic loader, malloc, OpenMP/MKL/OpenBLAS pools): forking cannot change them.
STARTUP_PREFIXES = (
    *("PYTHON", "LANG", "LC_", "LD_", "MALLOC_", "GLIBC_TUNABLES"),
    *("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "GOTO_"),
)
_PYTHON_NAMES = frozenset({"python", "python3", f"python3.{sys.version_info.minor}"})
_GRACE_SECONDS = 5.0


class ForkServerError(RuntimeError):
    """The fork server could not be started, or is not safe to fork from."""


class ForkServerLost(ForkServerError):
    """The fork server died or its connection broke."""


@dataclass(frozen=True)
class PythonProgram:
    """A forkable interpreter command line: what it runs, its arguments, and whether ``-u``."""

    kind: Literal["path", "module", "code"]
    target: str
    args: tuple[str, ...]
    unbuffered: bool


def python_program(
    argv: Sequence[str], env: Mapping[str, str], cwd: str | None
) -> PythonProgram | None:
    """What ``argv`` asks this interpreter to run, or None when it is not forkable."""
    if not argv or not _is_this_python(argv[0], env, cwd):
        return None
    rest = list(argv[1:])
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    while rest and rest[0] == "-u":
        unbuffered = True
        rest.pop(0)
    if not rest:
        return None
    head = rest[0]
    if head in ("-m", "-c") and len(rest) >= 2:
        kind: Literal["module", "code"] = "module" if head == "-m" else "code"
        return PythonProgram(kind, rest[1], tuple(rest[2:]), unbuffered)
    if head.startswith("-"):
        return None
    return PythonProgram("path", head, tuple(rest[1:]), unbuffered)


def _is_this_python(executable: str, env: Mapping[str, str], cwd: str | None) -> bool:
    if executable == sys.executable:
        return True
    if Path(executable).name not in _PYTHON_NAMES:
        return False
    if os.sep in executable:  # like exec: relative to the child's cwd, no PATH search
        found: str | None = str(Path(cwd or Path.cwd()) / executable)
    else:
        found = shutil.which(executable, path=os.pathsep.join(os.get_exec_path(dict(env))))
    if found is None:
        return False
    try:
        return Path(found).parent.samefile(Path(sys.executable).parent)
    except OSError:
        return False


def startup_mismatch(env: Mapping[str, str], server_env: Mapping[str, str]) -> str | None:
    """The first start-time variable whose value the child cannot get by forking, if any."""
    for name in sorted(set(env) | set(server_env)):
        if not name.startswith(STARTUP_PREFIXES) or name == "PYTHONUNBUFFERED":
            continue
        value = env.get(name)
        if name == "OMP_NUM_THREADS" and value and value.isdigit() and int(value) > 0:
            continue
        if value != server_env.get(name):
            return name
    return None


class _Child:
    """A forked worker as the connection tracks it: its exit, and a pidfd to outlive us."""

    def __init__(self, pid: int, exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self.exited = exited
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # already reaped (its exit report is on its way), or no pidfds
            self._pidfd = None

    def report(self, returncode: int) -> None:
        if not self.exited.done():
            self.exited.set_result(returncode)
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def kill(self) -> None:
        """SIGKILL its process group, unless it has already exited (its pid may be reused)."""
        if self._pidfd is None:
            return
        poll = select.poll()
        poll.register(self._pidfd, select.POLLIN)
        if not poll.poll(0):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def orphaned(self) -> None:
        """Its server is gone: kill it and report -SIGKILL once it has died."""
        self.kill()
        if self._pidfd is None:
            self.report(-signal.SIGKILL)
        else:
            loop = asyncio.get_running_loop()
            loop.add_reader(self._pidfd, self.report, -signal.SIGKILL)


class ForkedProcess:
    """A worker forked by the server, seen as a :class:`SpawnedProcess`."""

    def __init__(
        self, child: _Child, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader
    ) -> None:
        self._child = child
        self._stdout = stdout
        self._stderr = stderr

    @property
    def pid(self) -> int:
        """The forked worker's pid."""
        return self._child.pid

    @property
    def stdout(self) -> asyncio.StreamReader:
        """The worker's standard output."""
        return self._stdout

    @property
    def stderr(self) -> asyncio.StreamReader:
        """The worker's standard error."""
        return self._stderr

    @property
    def returncode(self) -> int | None:
        """The return code the server reported, or None while it runs."""
        exited = self._child.exited
        return exited.result() if exited.done() else None

    async def wait(self) -> int:
        """Wait until the server reports its exit and return the return code."""
        return await asyncio.shield(self._child.exited)


class _Connection:
    """One running server process, its socket, and the children it has not reported yet."""

    def __init__(
        self, process: asyncio.subprocess.Process, sock: socket.socket, env: dict[str, str]
    ) -> None:
        self.process = process
        self.sock = sock
        self.env = env
        self.hello: dict[str, Any] = {}
        self.lost = False
        self._buffer = bytearray()
        self._frames: list[dict[str, Any]] = []
        self._replies: dict[int, asyncio.Future[_Child]] = {}
        self._children: dict[int, _Child] = {}
        self._next_id = 0
        self._send_lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, preload: Sequence[str], ready_seconds: float) -> _Connection:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # What every worker it forks inherits in /proc/PID/environ: never the agent's NATS user.
        env = worker_base_environment(os.environ)
        try:
            process = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", SERVER_MODULE, str(theirs.fileno())),
                *(str(os.getpid()), *preload, TITLE_ROOM),
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        connection = cls(process, ours, env)
        try:
            await connection._handshake(ready_seconds)
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _handshake(self, ready_seconds: float) -> None:
        try:
            hello = await asyncio.wait_for(self._next_frame(), ready_seconds)
        except TimeoutError:
            raise ForkServerError(f"fork server not ready after {ready_seconds:g} s") from None
        if hello is None:
            code = await self.process.wait()
            raise ForkServerError(f"fork server exited with {code} before it was ready")
        if hello["cuda_initialized"]:
            raise ForkServerError("preloading initialised CUDA; forking from it is unsafe")
        self.hello = hello
        log.debug("fork server %d ready: %s", hello["pid"], hello)
        for name, why in hello["failed"].items():
            log.warning("fork server could not preload %s: %s", name, why)
        if hello["python_threads"] > 1:
            log.warning(
                "fork server runs %d Python threads after preloading; a fork copies only one",
                hello["python_threads"],
            )
        self._reader = asyncio.create_task(self._read(), name="forkserver-reader")

    async def _next_frame(self) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        while not self._frames:
            data = await loop.sock_recv(self.sock, 1 << 16)
            if not data:
                return None
            self._buffer.extend(data)
            self._frames.extend(decode_frames(self._buffer))
        return self._frames.pop(0)

    async def _read(self) -> None:
        try:
            while (frame := await self._next_frame()) is not None:
                self._dispatch(frame)
        except asyncio.CancelledError:
            # The event loop is going away, not the server: leave the workers be.
            self.lost = True
            raise
        except Exception:
            log.exception("fork server connection failed")
        self._lose()

    def _dispatch(self, frame: dict[str, Any]) -> None:
        if frame["op"] == "exited":
            child = self._children.pop(frame["pid"], None)
            if child is not None:
                child.report(frame["returncode"])
            return
        reply = self._replies.pop(frame["id"], None)
        if "errno" in frame:
            if reply is not None and not reply.done():
                reply.set_exception(OSError(frame["errno"], frame["strerror"], frame["filename"]))
            return
        child = _Child(frame["pid"], asyncio.get_running_loop().create_future())
        self._children[child.pid] = child
        if reply is None or reply.done():  # its spawn was cancelled: nobody would wait for it
            child.kill()
        else:
            reply.set_result(child)

    def _lose(self) -> None:
        self.lost = True
        with contextlib.suppress(OSError):  # a server still up sees EOF and exits
            self.sock.shutdown(socket.SHUT_RDWR)
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(ForkServerLost("fork server lost during spawn"))
        self._replies.clear()
        for child in self._children.values():
            child.orphaned()
        self._children.clear()

    async def spawn(
        self, program: PythonProgram, env: Mapping[str, str], cwd: str | None
    ) -> ForkedProcess:
        if self.lost:
            raise ForkServerLost("fork server is gone")
        self._next_id += 1
        request = _spawn_request(self._next_id, program, env, cwd)
        reply: asyncio.Future[_Child] = asyncio.get_running_loop().create_future()
        self._replies[self._next_id] = reply
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            null = os.open(os.devnull, os.O_RDWR)
            try:
                await self._send(encode_frame(request), [null, out_w, err_w])
            finally:
                for fd in (null, out_w, err_w):
                    os.close(fd)
            child = await reply
        except BaseException:
            self._replies.pop(request["id"], None)
            os.close(out_r)
            os.close(err_r)
            raise
        return ForkedProcess(child, await _pipe_reader(out_r), await _pipe_reader(err_r))

    async def _send(self, data: bytes, fds: list[int]) -> None:
        loop = asyncio.get_running_loop()
        async with self._send_lock:
            try:
                while True:
                    try:
                        sent = socket.send_fds(self.sock, [data], fds)
                        break
                    except BlockingIOError:
                        writable = loop.create_future()
                        loop.add_writer(self.sock, writable.set_result, None)
                        try:
                            await writable
                        finally:
                            loop.remove_writer(self.sock)
                await loop.sock_sendall(self.sock, data[sent:])
            except BaseException as exc:
                # A frame cut short garbles the stream: drop the connection.
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_RDWR)
                if isinstance(exc, OSError):
                    raise ForkServerLost(f"fork server connection broke: {exc}") from exc
                raise

    async def close(self) -> None:
        """Kill the children still running, then let the server see EOF and exit."""
        waiting = [child.exited for child in self._children.values()]
        for child in self._children.values():
            child.kill()
        if waiting:
            await asyncio.wait(waiting, timeout=_GRACE_SECONDS)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        if self._reader is not None:
            await self._reader
        if waiting:
            await asyncio.wait(waiting, timeout=_GRACE_SECONDS)
        self.sock.close()
        try:
            await asyncio.wait_for(self.process.wait(), _GRACE_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()


def _spawn_request(
    request_id: int, program: PythonProgram, env: Mapping[str, str], cwd: str | None
) -> dict[str, Any]:
    return {
        "op": "spawn",
        "id": request_id,
        "program": {
            "kind": program.kind,
            "target": program.target,
            "args": list(program.args),
            "unbuffered": program.unbuffered,
        },
        "env": dict(env),
        # The server's own cwd is the agent's at start; send what the agent means now.
        "cwd": None if cwd is None else str(Path(cwd).absolute()),
    }


async def _pipe_reader(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_LIMIT, loop=loop)
    # Wrapping a pipe fd does no I/O; the transport closes the file at EOF.
    pipe = open(fd, "rb", buffering=0)  # noqa: ASYNC230, SIM115
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return reader


class ForkServerSpawner:
    """Forks Python workers from a pre-warmed server; anything else runs as a plain subprocess."""

    def __init__(
        self,
        connection: _Connection,
        preload: Sequence[str],
        *,
        max_restarts: int,
        ready_seconds: float,
    ) -> None:
        self._connection: _Connection | None = connection
        self._preload = tuple(preload)
        self._max_restarts = max_restarts
        self._ready_seconds = ready_seconds
        self._restarts = 0
        self._retired: list[_Connection] = []
        self._plain = PlainSpawner()
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def start(
        cls,
        preload: Sequence[str] = ("torch",),
        *,
        max_restarts: int = 3,
        ready_seconds: float = 120.0,
    ) -> ForkServerSpawner:
        """Start the server and wait until it has imported ``preload``.

        Raises :class:`ForkServerError` when the server exits or is not ready within
        ``ready_seconds``, or when preloading initialised CUDA.
        """
        connection = await _Connection.open(tuple(preload), ready_seconds)
        return cls(connection, preload, max_restarts=max_restarts, ready_seconds=ready_seconds)

    @property
    def server_pid(self) -> int | None:
        """The running server's pid; None once it is lost (until a spawn restarts it)."""
        connection = self._connection
        return None if connection is None or connection.lost else connection.process.pid

    @property
    def has_torch_distributed(self) -> bool:
        """Whether the running server's preloads imported ``torch.distributed``."""
        connection = self._connection
        return connection is not None and bool(connection.hello.get("torch_distributed"))

    @property
    def preload_failures(self) -> dict[str, str]:
        """Module -> error for each preload module the running server could not import."""
        connection = self._connection
        return {} if connection is None else dict(connection.hello.get("failed", {}))

    async def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None
    ) -> SpawnedProcess:
        """Fork ``argv`` from the server when it is forkable, else start it as a plain process."""
        if self._closed:
            raise RuntimeError("spawner is closed")
        program = python_program(argv, env, cwd)
        connection = None if program is None else await self._live_connection()
        if program is not None and connection is not None:
            mismatch = startup_mismatch(env, connection.env)
            if mismatch is None:
                try:
                    return await connection.spawn(program, env, cwd)
                except ForkServerLost as exc:
                    log.warning("%s; starting this worker as a plain subprocess", exc)
            else:
                log.info("%s differs from the fork server's; plain subprocess", mismatch)
        return await self._plain.spawn(argv, env, cwd)

    async def _live_connection(self) -> _Connection | None:
        async with self._lock:
            connection = self._connection
            if connection is None or not connection.lost:
                return connection
            self._retired.append(connection)
            self._connection = None
            if self._restarts >= self._max_restarts:
                log.warning("fork server lost again; plain subprocesses from now on")
                return None
            self._restarts += 1
            log.warning("fork server lost; restart %d of %d", self._restarts, self._max_restarts)
            try:
                self._connection = await _Connection.open(self._preload, self._ready_seconds)
            except (ForkServerError, OSError) as exc:
                log.warning("fork server restart failed (%s); plain subprocesses from now on", exc)
                self._restarts = self._max_restarts
            return self._connection

    async def close(self) -> None:
        """Kill the workers still running, stop the server, and close the plain spawner."""
        self._closed = True
        async with self._lock:
            connections = [*self._retired, *([self._connection] if self._connection else [])]
            self._retired.clear()
            self._connection = None
        for connection in connections:
            await connection.close()
        await self._plain.close()
