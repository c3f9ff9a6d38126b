"""Training processes that the benches start without resurge, on this machine.

What the peers' baselines in ``bench/recovery_baselines.py`` and ``bench/resize_pause.py``
need, and nothing of resurge:

- :class:`TorchrunJob`: a multi-node torchrun job as one runs it on a cluster, one
  torchrun agent per node (``--nnodes N --nproc-per-node P``, c10d rendezvous on a free
  port of this machine), here all N agents on this machine; every agent's and worker's
  output goes through one pipe, read by :class:`Output`;
- :func:`worker_group`: P plain worker processes with torchrun's environment and no
  agent (what a launcher that relaunches every worker itself starts);
- :func:`workers_by_rank`: the training workers under some processes, by global
  ``RANK`` (read from ``/proc``), to signal or kill one;
- :func:`stop_tree`: SIGTERM, a grace, then SIGKILL to processes and every descendant.

Every process started here is stopped when its ``with`` block ends, on errors too, and
every wait is bounded by a deadline the caller gives.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "ddp" / "train.py"
WORKER_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL

STEP_LINE = re.compile(r"^step (\d+) loss ")
ERROR_LINE = re.compile(r"connectFullMesh|Error|FAILED|failed \(exitcode")
# "[rank2]: ", "E1202 16:07:13.974000 25591 path.py:1002] ", "[E1202 16:08:07.592 ...] "
LOG_PREFIX = re.compile(r"^(?:\[rank\d+\]: )?\[?(?:[EWI]\d{4} [\d:.]+ \d+ \S+\] )?")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without resurge's worker variables (a RESURGE_GENERATION would stop
    train.py from resuming from its checkpoint folder), plus :data:`WORKER_ENV` and ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RESURGE_")}
    return {**env, **WORKER_ENV, **(extra or {})}


def step_of(line: str) -> int:
    """The step number of a ``step N loss X`` line, else -1."""
    match = STEP_LINE.match(line)
    return int(match.group(1)) if match else -1


class Output:
    """Reads a process's output on a thread; keeps every line with its arrival time
    (``time.monotonic``)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines: list[tuple[float, str]] = []  # everything read so far
        self.eof = False
        self._queue: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        with contextlib.suppress(ValueError, OSError):
            for raw in iter(stream.readline, b""):
                arrived = time.monotonic()
                line = raw.decode(errors="replace").rstrip("\n")
                self.lines.append((arrived, line))
                self._queue.put((arrived, line))
        self._queue.put(None)

    def next(self, deadline: float) -> tuple[float, str] | None:
        """The next unread line, or None at end of output or once ``deadline`` passed."""
        if self.eof:
            return None
        try:
            item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if item is None:
            self.eof = True
        return item

    def wait_for(self, pattern: re.Pattern[str], deadline: float) -> tuple[float, str] | None:
        """The next line matching ``pattern`` (None: end of output or past ``deadline``)."""
        while (item := self.next(deadline)) is not None:
            if pattern.search(item[1]):
                return item
        return None

    def wait_for_steps(self, count: int, deadline: float) -> tuple[float, str] | None:
        """The ``count``-th step line from here on (None: end of output or past ``deadline``)."""
        item = None
        for _ in range(count):
            item = self.wait_for(STEP_LINE, deadline)
            if item is None:
                return None
        return item

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def tail(self, count: int = 5) -> str:
        return " | ".join(line for _, line in self.lines[-count:])

    def errors_since(self, since: float, limit: int = 3) -> list[str]:
        """Distinct error lines that arrived after ``since``, shortened, the telling first.

        The survivors' "Connection reset by peer" is what a kill is expected to cause,
        so restart failures (gloo's connectFullMesh, then anything else) come before it.
        """
        seen: list[str] = []
        for arrived, line in list(self.lines):
            if arrived < since or not ERROR_LINE.search(line):
                continue
            mesh = re.search(r"Gloo connectFullMesh failed.*?(?=, remote=|$)", line)
            text = mesh.group(0) if mesh else LOG_PREFIX.sub("", line.strip())
            text = re.sub(r"\s+", " ", text)[:200]
            if text not in seen:
                seen.append(text)
        seen.sort(key=lambda text: ("connectFullMesh" not in text, "reset by peer" in text))
        return seen[:limit]


# --- processes -------------------------------------------------------------------------


def _start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (to tell it from a later process with its id)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return children
    for task in tasks:
        with contextlib.suppress(OSError):
            children += [int(child) for child in (task / "children").read_text().split()]
    return children


def descendants(pid: int) -> dict[int, int]:
    """Every live descendant of ``pid``, as {pid: start time}."""
    found: dict[int, int] = {}
    todo = [pid]
    while todo:
        for child in _children(todo.pop()):
            started = _start_time(child)
            if started is not None and child not in found:
                found[child] = started
                todo.append(child)
    return found


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def workers_by_rank(pids: Iterable[int]) -> dict[int, int]:
    """The live training workers under ``pids`` (or among them), as {global RANK: pid}: of
    the processes running ``train.py`` with a rank's environment, the first started (the
    others are its children, such as DataLoader workers). Processes that torchrun or
    :func:`worker_group` exec'd, whose ``/proc`` environment is the one they started with."""
    candidates: dict[int, int] = {}
    for pid in pids:
        started = _start_time(pid)
        if started is not None:
            candidates[pid] = started
        candidates |= descendants(pid)
    workers: dict[int, tuple[int, int]] = {}
    for child, started in candidates.items():
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        rank = _environ(child).get("RANK")
        if TRAIN.name.encode() in cmdline and rank is not None:
            key = int(rank)
            if key not in workers or (started, child) < workers[key]:
                workers[key] = (started, child)
    return {rank: child for rank, (_, child) in workers.items()}


def _kill_if_same(pids: dict[int, int], sig: int) -> None:
    """Send ``sig`` to each process (and its group, where it leads one) still alive."""
    for pid, started in pids.items():
        if _start_time(pid) != started:
            continue  # gone, or its id now belongs to another process
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)


def stop_tree(procs: Iterable[subprocess.Popen[bytes]], grace: float = STOP_GRACE) -> None:
    """SIGTERM each process's group and every descendant, wait, then SIGKILL what is left
    (``grace`` 0: SIGKILL at once).

    torchrun starts each worker in a session of its own, so the workers are found
    through /proc (before torchrun dies and they lose their parent) and signalled one by
    one. Bounded: at most ``grace`` seconds plus a second.
    """
    procs = list(procs)
    tree: dict[int, int] = {}
    for proc in procs:
        tree |= descendants(proc.pid)
    first = signal.SIGTERM if grace > 0 else signal.SIGKILL
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, first)
    _kill_if_same(tree, first)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is None:
                tree |= descendants(proc.pid)  # workers torchrun may start meanwhile
        alive = [pid for pid, started in tree.items() if _start_time(pid) == started]
        if all(proc.poll() is not None for proc in procs) and not alive:
            break
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            tree |= descendants(proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    _kill_if_same(tree, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1.0)


# --- a multi-node torchrun job on one machine -------------------------------------------


@dataclass
class TorchrunJob:
    """``nodes`` torchrun agents of ``nproc`` workers each, c10d rendezvous: what a
    multi-node torchrun job runs, one agent per node or pod, here all on this machine.

    ``program`` (e.g. ``--no-python python -c CODE``) goes before the script, ``script``
    and ``args`` after; ``env`` is added to every agent's (and so worker's) environment.
    """

    nodes: int
    nproc: int
    args: Sequence[str]
    max_restarts: int = 0
    program: Sequence[str] = ()
    script: Path = TRAIN
    env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    output: Output | None = None

    def command(self, port: int) -> list[str]:
        """One agent's command line (the same for every agent: c10d assigns node ranks)."""
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(self.nodes), "--nproc-per-node", str(self.nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", f"bench-{port}", "--max-restarts", str(self.max_restarts),
            *self.program, str(self.script.relative_to(REPO)), *self.args,
        ]  # fmt: skip

    @contextlib.contextmanager
    def running(self) -> Iterator[TorchrunJob]:
        """Start every agent; stop them all (and their workers) when the block ends."""
        port = free_port()
        read_end, write_end = os.pipe()
        try:
            for _ in range(self.nodes):
                self.procs.append(
                    subprocess.Popen(
                        self.command(port),
                        cwd=REPO,
                        env=worker_env(self.env),
                        stdin=subprocess.DEVNULL,
                        stdout=write_end,
                        stderr=write_end,
                        start_new_session=True,
                    )
                )
            os.close(write_end)
            write_end = -1
            self.output = Output(os.fdopen(read_end, "rb"))
            read_end = -1
            yield self
        finally:
            stop_tree(self.procs)
            for fd in (read_end, write_end):
                if fd >= 0:
                    os.close(fd)
            if self.output is not None:
                self.output.join(2.0)

    @property
    def out(self) -> Output:
        assert self.output is not None, "not running"
        return self.output

    def workers(self) -> dict[int, int]:
        """The live workers, {global rank: pid}."""
        return workers_by_rank(proc.pid for proc in self.procs)

    def shown(self) -> str:
        """The agents' command, for a note: the environment it adds, then the command."""
        extra = {**WORKER_ENV, **self.env}
        command = " ".join(self.command(0)).replace("127.0.0.1:0", "127.0.0.1:PORT")
        command = command.replace("bench-0", "bench-PORT")
        return " ".join([*(f"{key}={value}" for key, value in extra.items()), command])

    def wait_exited(self, deadline: float) -> bool:
        """Whether every agent exited before ``deadline``."""
        while time.monotonic() < deadline:
            if all(proc.poll() is not None for proc in self.procs):
                return True
            time.sleep(0.01)
        return False


@contextlib.contextmanager
def worker_group(
    nproc: int, args: Sequence[str], extra_env: dict[str, str] | None = None
) -> Iterator[tuple[list[subprocess.Popen[bytes]], Output]]:
    """``nproc`` ``train.py`` processes with torchrun's environment (a fresh MASTER_PORT)
    and their output, all ranks through one pipe; stopped when the block ends."""
    port = free_port()
    read_end, write_end = os.pipe()
    procs: list[subprocess.Popen[bytes]] = []
    out: Output | None = None
    try:
        for rank in range(nproc):
            env = {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                **(extra_env or {}),
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(TRAIN.relative_to(REPO)), *args],
                    cwd=REPO,
                    env=worker_env(env),
                    stdin=subprocess.DEVNULL,
                    stdout=write_end,
                    stderr=write_end,
                    start_new_session=True,
                )
            )
        os.close(write_end)
        write_end = -1
        out = Output(os.fdopen(read_end, "rb"))
        read_end = -1
        yield procs, out
    finally:
        stop_tree(procs, grace=3.0)
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        if out is not None:
            out.join(2.0)
