"""Recovery-time baselines that ``bench/recovery.py`` sets beside resurge.

Both figures are seconds of wall time, and both end at the same event: the arrival of the
first ``step N loss X`` line that rank 0 of ``examples/ddp/train.py`` prints after
(re)starting, i.e. once new workers have formed their gloo process group, loaded the
checkpoint and finished one training step. Lines are timestamped (``time.monotonic``)
by a reader thread as they arrive through a pipe.

``torchrun_recoveries(kills, workdir)``
    torchrun's own fault tolerance (``--max-restarts``) on one node with 4 workers: from
    the SIGKILL of one worker (a non-zero local rank) to the first step of the worker
    group that torchrun restarted. It contains torchrun noticing the exit (it polls
    every ``--monitor-interval``, 0.1 s), stopping the survivors, the re-rendezvous,
    starting 4 new Python processes, importing torch, ``init_process_group``, loading
    the newest complete checkpoint and one step.

``cold_start_recoveries(samples, workdir)``
    the floor of any restart that relaunches every worker as a new process (as a pod or
    node-agent relaunch must): from spawning 4 fresh processes, told to resume from an
    existing checkpoint, to rank 0's first step. No failure detection, no stopping of
    survivors, no rendezvous: process start, imports, process group, checkpoint load,
    one step.

torchrun with gloo, as tried here (torch 2.13, CPU, 2 cores): with the default settings
(``--standalone``, or ``--rdzv-backend c10d --rdzv-endpoint``) the restarted group
usually fails to form: ``Gloo connectFullMesh failed ... Connection refused``, the same
on every further restart until ``--max-restarts`` is spent (once in 7 kills it formed
at the second restart, ~25 s after the kill). The cause, as torch's code reads: the
dynamic rendezvous shares its TCPStore with the workers (``TORCHELASTIC_USE_AGENT_STORE``)
and keeps that one store across restarts, while the workers' process-group keys
(``default_pg/0/...``) carry no attempt number, so a new worker can read the listening
address a dead worker published and connect to a closed port.
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` turns the sharing off (rank 0 of every attempt
hosts a fresh store on a free port) and every restart tried worked (16 of 16, with
``--standalone`` or c10d); it is :data:`BEST_SETTING`, with ``--standalone``.
``TORCH_GLOO_LAZY_INIT=1`` does not fix it (of 2 restarts, one formed and one hung).
``python bench/recovery_baselines.py --compare`` tries each of :data:`TORCHRUN_SETTINGS`
with one kill.

Every process started here is stopped before a function returns, on errors too, and
every wait is bounded. This is a benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/recovery_baselines.py [--kills 3] [--samples 3] [--compare]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "ddp" / "train.py"
NPROC = 4
CHECKPOINT_EVERY = 10
STEP_SECONDS = 0.02
ENOUGH_STEPS = 10_000_000  # never reached: every run here is stopped by time
RECOVERY_TIMEOUT = 60.0  # seconds allowed per recovery
START_TIMEOUT = 120.0  # seconds allowed for a first start (a loaded 2-core machine is slow)
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL
WORKER_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

STEP_LINE = re.compile(r"^step (\d+) loss ")
# What rank 0 prints once its process group formed, before its first step.
RANK0_START_LINE = re.compile(r"^rank 0/\d+: (?:resuming from .* at step|starting fresh at step)")
ERROR_LINE = re.compile(r"connectFullMesh|Error|FAILED|failed \(exitcode")
# "[rank2]: ", "E1202 16:07:13.974000 25591 path.py:1002] ", "[E1202 16:08:07.592 ...] "
LOG_PREFIX = re.compile(r"^(?:\[rank\d+\]: )?\[?(?:[EWI]\d{4} [\d:.]+ \d+ \S+\] )?")


@dataclass(frozen=True)
class TorchrunSetting:
    """How torchrun is told to rendezvous; ``args`` gets a free port for its endpoint."""

    name: str
    args: Callable[[int], list[str]]
    env: dict[str, str] = field(default_factory=dict)


def _standalone(_port: int) -> list[str]:
    return ["--standalone"]


def _c10d(port: int) -> list[str]:
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]


NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

TORCHRUN_SETTINGS: dict[str, TorchrunSetting] = {
    setting.name: setting
    for setting in [
        TorchrunSetting("standalone", _standalone),
        TorchrunSetting("c10d", _c10d),
        TorchrunSetting("standalone-unshared-store", _standalone, NO_SHARED_STORE),
        TorchrunSetting("c10d-unshared-store", _c10d, NO_SHARED_STORE),
        TorchrunSetting("standalone-gloo-lazy-init", _standalone, {"TORCH_GLOO_LAZY_INIT": "1"}),
    ]
}
BEST_SETTING = TORCHRUN_SETTINGS["standalone-unshared-store"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without resurge's worker variables (a RESURGE_GENERATION would stop
    train.py from resuming from its checkpoint folder), plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RESURGE_")}
    return {**env, **WORKER_ENV, **(extra or {})}


class Output:
    """Reads a process's output on a thread; keeps every line with its arrival time."""

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

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

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


def torchrun_workers(pid: int) -> dict[int, int]:
    """The live training workers under torchrun ``pid``, as {local rank: pid}: of the
    processes with a rank's environment, the first started (the others are its children,
    such as DataLoader workers)."""
    workers: dict[int, tuple[int, int]] = {}
    for child, started in descendants(pid).items():
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        local_rank = _environ(child).get("LOCAL_RANK")
        if TRAIN.name.encode() in cmdline and local_rank is not None:
            rank = int(local_rank)
            if rank not in workers or (started, child) < workers[rank]:
                workers[rank] = (started, child)
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
    """SIGTERM each process's group and every descendant, wait, then SIGKILL what is left.

    torchrun starts each worker in a session of its own, so the workers are found
    through /proc (before torchrun dies and they lose their parent) and signalled one by
    one. Bounded: at most ``grace`` seconds plus a second.
    """
    procs = list(procs)
    tree: dict[int, int] = {}
    for proc in procs:
        tree |= descendants(proc.pid)
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
    _kill_if_same(tree, signal.SIGTERM)
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


# --- torchrun ----------------------------------------------------------------------------


def torchrun_command(
    setting: TorchrunSetting,
    port: int,
    kills: int,
    ckpt: Path,
    program: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> list[str]:
    """``program`` (e.g. ``--no-python python -c CODE``) goes before the script."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *setting.args(port),
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(NPROC),
        "--max-restarts",
        str(kills + 1),
        *program,
        str(TRAIN.relative_to(REPO)),
        "--steps",
        str(ENOUGH_STEPS),
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        "--step-seconds",
        str(STEP_SECONDS),
        "--checkpoint-dir",
        str(ckpt),
        "--log-every",
        "1",
        *extra_args,
    ]


def _step_of(line: str) -> int:
    match = STEP_LINE.match(line)
    return int(match.group(1)) if match else -1


def _failed_restarts(out: Output, since: float) -> int:
    """Restarts that failed since ``since``, a kill: torchrun logs "failed (exitcode: ...)"
    once per failed attempt, the killed one first; with gloo errors it is connectFullMesh."""
    failed = sum("failed (exitcode" in line for at, line in out.lines if at >= since)
    return max(0, failed - 1)


def torchrun_recoveries(
    kills: int,
    workdir: Path,
    setting: TorchrunSetting = BEST_SETTING,
    program: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> tuple[list[float], str]:
    """Kill a torchrun worker ``kills`` times; seconds from each kill to the next first step.

    Runs ``torchrun --max-restarts kills+1`` (rendezvous per ``setting``) on
    ``examples/ddp/train.py`` with checkpoints in ``workdir/ckpt`` (emptied first).
    Before each kill the group has trained 3 steps past a checkpoint; the victim is
    local rank 1, 2, 3, 1, ... A recovery that does not reach a first step within
    ``RECOVERY_TIMEOUT`` s (or torchrun giving up) ends the run: the recoveries that
    worked are returned, with a note saying what happened (error lines included).
    ``program`` and ``extra_args`` are :func:`torchrun_command`'s.
    """
    ckpt = workdir / "ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    ckpt.mkdir(parents=True)
    port = free_port()
    command = torchrun_command(setting, port, kills, ckpt, program, extra_args)
    env = _worker_env(setting.env)
    shown = " ".join(
        [*(f"{key}={env[key]}" for key in [*setting.env, *WORKER_ENV]), shlex.join(command)]
    )
    seconds: list[float] = []
    events: list[str] = []
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    out = Output(proc.stdout)
    try:
        began = time.monotonic()
        first = out.wait_for(STEP_LINE, began + START_TIMEOUT)
        if first is None:
            events.append(f"no first step within {START_TIMEOUT:.0f} s")
            errors = out.errors_since(began)
            if errors:
                events.append("errors: " + " | ".join(errors))
        attempt_start = _step_of(first[1]) if first else -1
        for kill in range(kills if first else 0):
            # Train a little past the next checkpoint, so the restart has one to load.
            checkpoint = -(-attempt_start // CHECKPOINT_EVERY) * CHECKPOINT_EVERY
            ready_deadline = time.monotonic() + RECOVERY_TIMEOUT
            while (item := out.wait_for(STEP_LINE, ready_deadline)) is not None:
                if _step_of(item[1]) >= checkpoint + 3:
                    break
            if item is None:
                events.append(f"kill {kill + 1}: no step {checkpoint + 3} to kill after")
                break
            victim_rank = 1 + kill % (NPROC - 1)
            victim = torchrun_workers(proc.pid).get(victim_rank)
            if victim is None:
                events.append(f"kill {kill + 1}: no running local rank {victim_rank} to kill")
                break
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            deadline = killed + RECOVERY_TIMEOUT
            restarted = out.wait_for(RANK0_START_LINE, deadline)
            stepped = out.wait_for(STEP_LINE, deadline) if restarted else None
            failed = _failed_restarts(out, killed)
            restarts = f", {failed} failed restart(s)" if failed else ""
            if stepped is None:
                why = f"no step within {RECOVERY_TIMEOUT:.0f} s"
                if out.eof:
                    why = "torchrun gave up"
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        why += f" (exit status {proc.wait(5.0)})"
                errors = out.errors_since(killed)
                events.append(
                    f"kill {kill + 1} (local rank {victim_rank}): not recovered{restarts}, {why}"
                    + (": " + " | ".join(errors) if errors else "")
                )
                break
            seconds.append(stepped[0] - killed)
            attempt_start = _step_of(stepped[1])
            events.append(
                f"kill {kill + 1} (local rank {victim_rank}): step {attempt_start} after "
                f"{seconds[-1]:.2f} s{restarts}"
            )
    finally:
        stop_tree([proc])
        out.join(2.0)
    note = f"setting {setting.name}: {len(seconds)}/{kills} recovered; " + "; ".join(events)
    note += f"; command (in {REPO}): {shown}"
    return seconds, note


# --- cold start --------------------------------------------------------------------------


@contextlib.contextmanager
def _worker_group(
    args: list[str], extra_env: dict[str, str] | None = None
) -> Iterator[tuple[list[subprocess.Popen[bytes]], Output]]:
    """NPROC ``train.py`` processes with torchrun's environment (a fresh MASTER_PORT) and
    their output, all ranks through one pipe; stopped when the block ends."""
    port = free_port()
    read_end, write_end = os.pipe()
    procs: list[subprocess.Popen[bytes]] = []
    out: Output | None = None
    try:
        for rank in range(NPROC):
            env = {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(NPROC),
                "LOCAL_WORLD_SIZE": str(NPROC),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                **(extra_env or {}),
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(TRAIN.relative_to(REPO)), *args],
                    cwd=REPO,
                    env=_worker_env(env),
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


def make_checkpoint(directory: Path, step: int = CHECKPOINT_EVERY) -> Path:
    """Train ``step`` steps from scratch with NPROC processes; the checkpoint they wrote."""
    shutil.rmtree(directory, ignore_errors=True)
    args = ["--steps", str(step), "--checkpoint-every", str(step), "--checkpoint-dir"]
    with _worker_group([*args, str(directory)]) as (procs, out):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and any(proc.poll() is None for proc in procs):
            time.sleep(0.1)
        codes = [proc.poll() for proc in procs]
    path = directory / f"step-{step:08d}"
    if codes != [0] * NPROC or not (path / ".metadata").is_file():
        tail = " | ".join(line for _, line in out.lines[-5:])
        raise RuntimeError(f"could not write the checkpoint {path} (exits {codes}): {tail}")
    return path


def cold_start_recoveries(samples: int, workdir: Path) -> list[float]:
    """Seconds from spawning NPROC fresh workers, resuming from a checkpoint, to the first step.

    Writes a checkpoint of step 10 into ``workdir/cold-ckpt`` first, then per sample
    starts ``train.py`` NPROC times with torchrun's environment, a fresh MASTER_PORT,
    RESURGE_GENERATION=1 and RESURGE_RESUME_CHECKPOINT/RESURGE_RESUME_STEP naming that
    checkpoint, times rank 0's first ``step`` line and stops the processes. A sample
    without a first step within START_TIMEOUT s is printed and left out.
    """
    checkpoint = make_checkpoint(workdir / "cold-ckpt")
    scratch = workdir / "cold-scratch"  # nothing is saved: --checkpoint-every 0
    resume = {
        "RESURGE_GENERATION": "1",
        "RESURGE_RESUME_CHECKPOINT": str(checkpoint),
        "RESURGE_RESUME_STEP": str(CHECKPOINT_EVERY),
    }
    args = [
        "--steps",
        str(ENOUGH_STEPS),
        "--checkpoint-every",
        "0",
        "--step-seconds",
        str(STEP_SECONDS),
        "--checkpoint-dir",
        str(scratch),
        "--log-every",
        "1",
    ]
    seconds: list[float] = []
    for sample in range(samples):
        spawned = time.monotonic()
        with _worker_group(args, resume) as (_procs, out):
            first = out.wait_for(STEP_LINE, spawned + START_TIMEOUT)
        if first is None:
            tail = " | ".join(line for _, line in out.lines[-3:])
            print(f"cold start {sample + 1}: no first step: {tail}", file=sys.stderr)
        else:
            seconds.append(first[0] - spawned)
    return seconds


# --- by hand -----------------------------------------------------------------------------


def _summary(seconds: list[float]) -> str:
    if not seconds:
        return "none"
    shown = ", ".join(f"{value:.2f}" for value in seconds)
    return f"median {statistics.median(seconds):.2f} s (of {shown})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kills", type=int, default=3, help="torchrun: workers to kill")
    parser.add_argument("--samples", type=int, default=3, help="cold starts to time")
    parser.add_argument(
        "--setting",
        choices=sorted(TORCHRUN_SETTINGS),
        default=BEST_SETTING.name,
        help=f"torchrun rendezvous setting (default {BEST_SETTING.name})",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="first try every torchrun setting with one kill each",
    )
    parser.add_argument("--workdir", type=Path, help="default: a temporary folder")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="recovery-baselines-") as tmp:
        workdir = args.workdir or Path(tmp)
        if args.compare:
            for name, setting in TORCHRUN_SETTINGS.items():
                seconds, note = torchrun_recoveries(1, workdir / name, setting)
                print(f"[compare] {name}: {_summary(seconds)}", flush=True)
                print("    " + note.replace("; ", "\n    "), flush=True)
        seconds, note = torchrun_recoveries(
            args.kills, workdir / "torchrun", TORCHRUN_SETTINGS[args.setting]
        )
        print(f"torchrun restart, kill -> first step: {_summary(seconds)}", flush=True)
        print("    " + note.replace("; ", "\n    "), flush=True)
        cold = cold_start_recoveries(args.samples, workdir / "cold")
        print(f"cold start of {NPROC} workers, spawn -> first step: {_summary(cold)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
