"""The fork server process: import the heavy modules once, then fork a worker per request.

Started by :class:`resurge_node_agent.launch.forkserver.ForkServerSpawner` as
``python -m resurge_node_agent.launch.forkserver_main FD AGENT_PID [MODULE ...]``, never by
hand. FD is its end of a unix stream socket pair; every message either way is one
frame: a 4-byte big-endian length, then UTF-8 JSON. AGENT_PID is the process that
started it: the server dies with it (SIGKILL, its parent-death signal), and exits at
once if it is already gone.

- It imports each MODULE once. One that fails is reported in the ``ready`` frame, not
  fatal. It never starts threads of its own and never touches ``torch.cuda``; the
  ``ready`` frame says whether CUDA ended up initialised and how many threads exist, so
  the agent can refuse an unsafe server, and whether ``torch.distributed`` is imported
  (by whichever module: ``torch``, ``lightning``), so it can host rendezvous stores.
- ``spawn`` request (with three fds by SCM_RIGHTS: stdin, stdout, stderr): it forks; the
  child (``run_child``) becomes a session leader, takes the fds as 0/1/2, the request's
  environment (all of it, nothing else), cwd, argv and default signal dispositions, and
  runs the Python program in-process; it dies with the server (parent-death signal),
  so every worker dies with the agent. A worker (its environment has ``RANK``) takes
  the process title ``resurge worker job=J rank=R local_rank=L gen=G: python ARGV``,
  so ``ps`` tells which rank is which; its ``sys.argv`` stays the program's own and
  ``/proc/PID/environ`` its environment (``SPT_NOENV``: the title is written over the
  server's command line only, which the agent pads with :data:`TITLE_ROOM`). The
  answer is ``spawned`` with the pid, or with ``errno``/``strerror``/``filename`` when
  the cwd is unusable (nothing is forked then).
- It is the children's parent: it reaps each one and sends ``exited`` with the pid and
  the return code (negative signal number when a signal ended it).
- It exits when the connection closes; children still running then get SIGKILL.

Only the standard library is imported here, so the agent can share the framing helpers
(the server itself imports ``setproctitle`` before it forks anything).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import errno
import gc
import importlib
import importlib.util
import io
import json
import os
import random
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from resurge_node_agent.launch.parent_death import die_with_parent

__all__ = ["HEADER", "TITLE_ROOM", "decode_frames", "encode_frame", "main", "run_child"]

HEADER = struct.Struct(">I")
# Received fds per recvmsg: Linux hands over one request's three at a time.
_MAX_FDS = 16
_RECV_BYTES = 1 << 16
# A worker's process title, at most (a ``-c`` program's code can be long).
_TITLE_CHARS = 300
# The server's last argument, blank: room on its command line for a worker's title
# (without touching the environment, a title fits in the command line it replaces).
TITLE_ROOM = " " * _TITLE_CHARS

# Dispositions this interpreter started with (SIGINT -> KeyboardInterrupt, SIGPIPE
# ignored, ...): a child gets these back, as a freshly started interpreter would have.
_INITIAL_HANDLERS: dict[int, Any] = {}

# The environment the server was started with; a child's thread settings are compared
# with it.
_SERVER_ENV: dict[str, str] = {}
_SERVER_PID = 0


def encode_frame(message: Mapping[str, Any]) -> bytes:
    """One frame holding ``message``: its length, then its JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


def decode_frames(buffer: bytearray) -> list[dict[str, Any]]:
    """Remove and return every complete frame at the start of ``buffer``."""
    frames: list[dict[str, Any]] = []
    while len(buffer) >= HEADER.size:
        (size,) = HEADER.unpack_from(buffer)
        if len(buffer) < HEADER.size + size:
            break
        frames.append(json.loads(buffer[HEADER.size : HEADER.size + size]))
        del buffer[: HEADER.size + size]
    return frames


def main(argv: Sequence[str]) -> int:
    """Import ``argv[2:]``, then fork workers on request until the agent goes away."""
    # A server left behind would hold its preloaded memory (and any CUDA context) forever.
    die_with_parent(int(argv[1]))
    for signum in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            _INITIAL_HANDLERS[signum] = signal.getsignal(signum)
    _SERVER_ENV.update(os.environ)
    global _SERVER_PID
    _SERVER_PID = os.getpid()
    conn = socket.socket(fileno=int(argv[0]))
    conn.set_inheritable(False)
    preloaded, failed = _preload([name for name in argv[2:] if name.strip()])
    # The title goes over the command line alone (TITLE_ROOM), never over the environment:
    # /proc/PID/environ stays readable, as people and tools read a rank's variables there.
    os.environ["SPT_NOENV"] = "1"
    with contextlib.suppress(ImportError):  # titles are a convenience, never a failure
        # Set up here, while argv and environ are still where the kernel put them: a
        # child that set it up after replacing its environment could not retitle itself.
        importlib.import_module("setproctitle").getproctitle()
    # Everything imported so far is shared with every child: keep the collector from
    # touching (and so copying) those pages in them.
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # The agent going away mid-message is how the server normally learns to stop.
    with contextlib.suppress(ConnectionError):
        conn.sendall(encode_frame(_ready(preloaded, failed)))
        _serve(conn, wake_r, private_fds=(conn.fileno(), wake_r, wake_w))
    return 0


def _preload(modules: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    preloaded: list[str] = []
    failed: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
        else:
            preloaded.append(name)
    return preloaded, failed


def _ready(preloaded: list[str], failed: dict[str, str]) -> dict[str, Any]:
    torch_cuda = sys.modules.get("torch.cuda")
    cuda = bool(torch_cuda is not None and torch_cuda.is_initialized())
    return {
        "op": "ready",
        "pid": os.getpid(),
        "preloaded": preloaded,
        "failed": failed,
        "cuda_initialized": cuda,
        # Whatever preloaded it (torch itself, lightning, transformers ...): a store
        # process forked from here can host a c10d store without importing torch.
        "torch_distributed": "torch.distributed" in sys.modules,
        "python_threads": threading.active_count(),
        "native_threads": sum(1 for _ in Path("/proc/self/task").iterdir()),
    }


def _serve(conn: socket.socket, wake_r: int, private_fds: tuple[int, ...]) -> None:
    buffer = bytearray()
    fds: list[int] = []
    while True:
        ready, _, _ = select.select([conn.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(conn)
        if conn.fileno() not in ready:
            continue
        data, new_fds, flags, _ = socket.recv_fds(conn, _RECV_BYTES, _MAX_FDS)
        fds.extend(new_fds)
        if flags & socket.MSG_CTRUNC:
            raise RuntimeError("file descriptors were truncated")
        if not data:
            return
        buffer.extend(data)
        for request in decode_frames(buffer):
            if len(fds) < 3:
                raise RuntimeError("a spawn request came without its three fds")
            request_fds, fds[:3] = fds[:3], []
            # Fds already received for later requests are private too: a child holding
            # another worker's pipe would keep that pipe from ever reaching EOF.
            _spawn(conn, request, request_fds, (*private_fds, *fds))


def _spawn(
    conn: socket.socket, request: dict[str, Any], fds: list[int], private_fds: tuple[int, ...]
) -> None:
    try:
        cwd = request["cwd"]
        if cwd is not None and not Path(cwd).is_dir():
            error = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), cwd)
            conn.sendall(encode_frame(_refusal(request["id"], error)))
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                run_child(request, fds, private_fds)
            finally:  # whatever happens, a child never returns into the server's loop
                os._exit(70)
        conn.sendall(encode_frame({"op": "spawned", "id": request["id"], "pid": pid}))
    finally:
        for fd in fds:
            os.close(fd)


def _refusal(request_id: int, error: OSError) -> dict[str, Any]:
    return {
        "op": "spawned",
        "id": request_id,
        "errno": error.errno,
        "strerror": error.strerror,
        "filename": error.filename,
    }


def _reap(conn: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        conn.sendall(encode_frame({"op": "exited", "pid": pid, "returncode": code}))


def run_child(request: dict[str, Any], fds: list[int], private_fds: tuple[int, ...]) -> NoReturn:
    """In the forked child: become the requested program, run it, and ``os._exit``."""
    try:
        _become(request, fds, private_fds)
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
            sys.stderr.flush()
        os._exit(127)
    code = _run_program(request["program"])
    code = _finish(code)
    os._exit(code)


def _become(request: dict[str, Any], fds: list[int], private_fds: tuple[int, ...]) -> None:
    die_with_parent(_SERVER_PID)  # the server dies with the agent, so a worker does too
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in {*fds, *private_fds} - {0, 1, 2}:
        os.close(fd)
    signal.set_wakeup_fd(-1)
    for signum, handler in _INITIAL_HANDLERS.items():
        with contextlib.suppress(OSError, ValueError, TypeError):
            signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    if request["cwd"] is not None:
        os.chdir(request["cwd"])
    _reopen_stdio(request["program"]["unbuffered"])
    _refresh_inherited_state(env)
    _set_title(env, request["program"])


def _set_title(env: Mapping[str, str], program: Mapping[str, Any]) -> None:
    """Name a worker in ``ps`` by its job, rank and generation (argv and comm)."""
    titles = sys.modules.get("setproctitle")
    if titles is None or "RANK" not in env:
        return
    head = {"path": [], "module": ["-m"], "code": ["-c"]}[program["kind"]]
    argv = ["python", *head, program["target"], *program["args"]]
    title = (
        f"resurge worker job={env.get('RESURGE_JOB', '')} rank={env['RANK']} "
        f"local_rank={env.get('LOCAL_RANK', '')} gen={env.get('RESURGE_GENERATION', '')}: "
        + " ".join(argv)
    )
    titles.setproctitle(title[:_TITLE_CHARS])


def _reopen_stdio(unbuffered: bool) -> None:
    """New sys.std* objects on fds 0/1/2, buffered as a fresh interpreter would buffer them.

    ``sys.__std*__`` keep the server's objects; they write to the same fds 0/1/2.
    """
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    errors = getattr(sys.stdout, "errors", None) or "strict"
    # These live until os._exit, as the interpreter's own std* objects would.
    sys.stdin = open(0, encoding=encoding, errors=errors, closefd=False)  # noqa: SIM115
    sys.stdout = _writer(1, encoding, errors, unbuffered, line=os.isatty(1))
    sys.stderr = _writer(2, encoding, "backslashreplace", unbuffered, line=True)


def _writer(fd: int, encoding: str, errors: str, unbuffered: bool, line: bool) -> io.TextIOWrapper:
    binary = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(binary, encoding, errors, line_buffering=line, write_through=unbuffered)


def _refresh_inherited_state(env: Mapping[str, str]) -> None:
    """Undo what the fork shares among siblings but separate processes would not."""
    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None:
        multiprocessing.current_process().authkey = os.urandom(32)
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads != _SERVER_ENV.get("OMP_NUM_THREADS") and threads.isdigit():
        torch.set_num_threads(int(threads))


def _run_program(program: dict[str, Any]) -> int:
    """Run it as ``python -m``/``-c``/``script`` would; the exit code the interpreter would give."""
    try:
        return _execute(program["kind"], program["target"], program["args"])
    except SystemExit as exc:
        return _exit_code(exc)
    except KeyboardInterrupt as exc:
        traceback.print_exception(exc.with_traceback(_user_frames(exc.__traceback__)))
        _die_of(signal.SIGINT)
    except BaseException as exc:
        exc = exc.with_traceback(_user_frames(exc.__traceback__))
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return 1


def _user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback without this module's and runpy's frames, as ``python`` prints it."""
    ours = {_run_program.__code__.co_filename, runpy.run_path.__code__.co_filename}
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return tb


def _execute(kind: str, target: str, args: list[str]) -> int:
    if kind == "code":
        sys.argv = ["-c", *args]
        _set_path0("")
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = module
        exec(compile(target, "<string>", "exec"), module.__dict__)
    elif kind == "module":
        sys.argv = ["-m", *args]
        _set_path0(str(Path.cwd()))
        if importlib.util.find_spec(target) is None:
            print(f"{sys.executable}: No module named {target}", file=sys.stderr)
            return 1
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        script = Path(target)
        if not script.exists():
            why = f"[Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}"
            where = str(script.absolute())
            print(f"{sys.executable}: can't open file {where!r}: {why}", file=sys.stderr)
            return 2
        _set_path0(str(script.resolve().parent))
        runpy.run_path(target, run_name="__main__")
    return 0


def _set_path0(entry: str) -> None:
    # The server itself was started with -m, so sys.path[0] is its start folder.
    if not sys.flags.safe_path:
        sys.path[0] = entry


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _finish(code: int) -> int:
    """Join non-daemon threads, run atexit, flush: what interpreter shutdown would do."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            code = code or 120
    return code


def _die_of(signum: signal.Signals) -> NoReturn:
    _finish(0)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
