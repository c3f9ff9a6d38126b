"""Recovery-time baselines that ``bench/recovery.py`` sets beside resurge.

Both run the job resurge's variants run: ``examples/ddp/train.py`` on 2 nodes x 2 workers
(4 ranks, gloo on CPU), a checkpoint every :data:`CHECKPOINT_EVERY` steps, 0.02 s of
sleep per step; both break it the same way: once the current generation trained
:data:`STEPS_BEFORE_KILL` steps (and ``trained_seconds``), this process SIGKILLs the
worker of global rank 1, 2, 3, 1, ... (found in ``/proc`` by its ``RANK``), and the time
counts from just after that ``os.kill`` to the arrival of the first ``step N loss X``
line that rank 0 prints after (re)starting, i.e. once new workers have formed their gloo
process group, loaded the checkpoint and finished one training step. Lines are
timestamped (``time.monotonic``) by a reader thread as they arrive through a pipe.

``torchrun_recoveries(kills, workdir)``
    torchrun's own fault tolerance (``--max-restarts``), as a 2-node job runs it: two
    torchrun agents of 2 workers each (``--nnodes 2 --nproc-per-node 2``, c10d rendezvous),
    on this machine. It contains the killed worker's agent noticing the exit (it polls
    every ``--monitor-interval``, 0.1 s), stopping its survivor, the other agent seeing the
    new round of the rendezvous and stopping its workers, the re-rendezvous, starting 4 new
    Python processes, importing torch, ``init_process_group``, loading the newest complete
    checkpoint and one step.

``full_restart_recoveries(kills, workdir)``
    the floor of a full-job restart (every worker relaunched as a new process, as a job
    whose pods are all recreated is): 4 plain worker processes with torchrun's
    environment and no agent; at the kill this process at once SIGKILLs the 3 survivors,
    waits for them to be gone and starts 4 new ones (a fresh MASTER_PORT), which resume
    from the newest complete checkpoint in the folder. No failure detection, no grace, no
    rendezvous, no pod scheduling or container start: process start, imports, process
    group, checkpoint load, one step.

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
hosts a fresh store on a free port) and every restart tried with one agent of 4 workers
worked (16 of 16); it is
:data:`BEST_SETTING`. ``TORCH_GLOO_LAZY_INIT=1`` does not fix it (of 2 restarts, one
formed and one hung). With the unshared store and 2 agents, a restart still now and then forms
no group within RECOVERY_TIMEOUT (on 2 loaded cores, 2 runs of ``bench/recovery.py
--kills 5``: 4 of 5 kills of (c) recovered, then 5 of 5; of (j), 1 of 3 then 0 of 3).
``python bench/recovery_baselines.py --compare`` tries each of
:data:`TORCHRUN_SETTINGS` with one kill.

Every process started here is stopped before a function returns, on errors too, and
every wait is bounded. This is a benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/recovery_baselines.py [--kills 3] [--compare]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchrun_processes import (
    STEP_LINE,
    Output,
    TorchrunJob,
    step_of,
    stop_tree,
    worker_group,
    workers_by_rank,
)

NODES, NPROC = 2, 2  # the topology of resurge's variants in bench/recovery.py
CHECKPOINT_EVERY = 5  # steps, as bench/recovery.py's job
STEP_SECONDS = 0.02
STEPS_BEFORE_KILL = 12  # steps of the current generation before each kill
ENOUGH_STEPS = 10_000_000  # never reached: every run here is stopped by time
RECOVERY_TIMEOUT = 120.0  # seconds allowed per recovery
START_TIMEOUT = 120.0  # seconds allowed for a first start (a loaded 2-core machine is slow)

# What rank 0 prints once its process group formed, before its first step.
RANK0_START_LINE = re.compile(r"^rank 0/\d+: (?:resuming from .* at step|starting fresh at step)")


@dataclass(frozen=True)
class TorchrunSetting:
    """Environment that changes how torchrun's rendezvous hands its store to the workers."""

    name: str
    env: dict[str, str] = field(default_factory=dict)


NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

TORCHRUN_SETTINGS: dict[str, TorchrunSetting] = {
    setting.name: setting
    for setting in [
        TorchrunSetting("c10d"),
        TorchrunSetting("c10d-unshared-store", NO_SHARED_STORE),
        TorchrunSetting("c10d-gloo-lazy-init", {"TORCH_GLOO_LAZY_INIT": "1"}),
    ]
}
BEST_SETTING = TORCHRUN_SETTINGS["c10d-unshared-store"]


def script_args(ckpt: Path, extra_args: Sequence[str] = ()) -> list[str]:
    """train.py's flags: the same steps, cadence and step time as bench/recovery.py's job."""
    return [
        "--steps", str(ENOUGH_STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--step-seconds", str(STEP_SECONDS), "--checkpoint-dir", str(ckpt), "--log-every", "1",
        *extra_args,
    ]  # fmt: skip


def victim_of(kill: int) -> int:
    """The global rank the ``kill``-th kill (from 0) breaks: 1, 2, 3, 1, ..."""
    return 1 + kill % (NODES * NPROC - 1)


def trained(out: Output, first: tuple[float, str], trained_seconds: float) -> bool:
    """Wait until the generation whose first step line is ``first`` trained
    STEPS_BEFORE_KILL steps and ``trained_seconds``; False if it stopped first."""
    deadline = time.monotonic() + RECOVERY_TIMEOUT + trained_seconds
    if out.wait_for_steps(STEPS_BEFORE_KILL - 1, deadline) is None:
        return False
    while time.monotonic() < first[0] + trained_seconds:
        if out.wait_for(STEP_LINE, deadline) is None:
            return False
    return True


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
    trained_seconds: float = 0.0,
) -> tuple[list[float], str]:
    """Kill a torchrun worker ``kills`` times; seconds from each kill to the next first step.

    Runs 2 torchrun agents x 2 workers with ``--max-restarts 3*kills+3`` (each agent counts
    its own restarts, a failed one too: a budget that ends no run here; environment per
    ``setting``) on ``examples/ddp/train.py`` with checkpoints in ``workdir/ckpt`` (emptied
    first). A recovery that does not reach a first step within ``RECOVERY_TIMEOUT`` s (or
    torchrun giving up) ends the run: the recoveries that worked are returned, with a note
    saying what happened (error lines included). ``program`` (e.g. ``--no-python python -c
    CODE``) goes before the script, ``extra_args`` after its flags.
    """
    ckpt = workdir / "ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    ckpt.mkdir(parents=True)
    job = TorchrunJob(
        nodes=NODES, nproc=NPROC, args=script_args(ckpt, extra_args), max_restarts=3 * kills + 3,
        program=program, env=setting.env,
    )  # fmt: skip
    seconds: list[float] = []
    events: list[str] = []
    with job.running():
        out = job.out
        began = time.monotonic()
        first = out.wait_for(STEP_LINE, began + START_TIMEOUT)
        if first is None:
            events.append(f"no first step within {START_TIMEOUT:.0f} s")
            errors = out.errors_since(began)
            if errors:
                events.append("errors: " + " | ".join(errors))
        for kill in range(kills):
            if first is None:
                break
            victim_rank = victim_of(kill)
            if not trained(out, first, trained_seconds):
                events.append(f"kill {kill + 1}: the job stopped training before it")
                break
            victim = job.workers().get(victim_rank)
            if victim is None:
                events.append(f"kill {kill + 1}: no running rank {victim_rank} to kill")
                break
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            deadline = killed + RECOVERY_TIMEOUT
            restarted = out.wait_for(RANK0_START_LINE, deadline)
            first = out.wait_for(STEP_LINE, deadline) if restarted else None
            failed = _failed_restarts(out, killed)
            restarts = f", {failed} failed restart(s)" if failed else ""
            if first is None:
                why = f"no step within {RECOVERY_TIMEOUT:.0f} s"
                if out.eof:
                    why = "torchrun gave up"
                errors = out.errors_since(killed)
                events.append(
                    f"kill {kill + 1} (rank {victim_rank}): not recovered{restarts}, {why}"
                    + (": " + " | ".join(errors) if errors else "")
                )
                break
            seconds.append(first[0] - killed)
            events.append(
                f"kill {kill + 1} (rank {victim_rank}): step {step_of(first[1])} after "
                f"{seconds[-1]:.2f} s{restarts}"
            )
    note = f"setting {setting.name}: {len(seconds)}/{kills} recovered; " + "; ".join(events)
    note += f"; each of the {NODES} agents: {job.shown()}"
    return seconds, note


def full_restart_recoveries(kills: int, workdir: Path) -> list[float]:
    """Seconds from each kill to the first step of 4 workers relaunched cold.

    4 plain ``train.py`` processes (torchrun's environment, no agent) train with
    checkpoints in ``workdir/ckpt``; at each kill the survivors are SIGKILLed at once and,
    once gone, 4 new processes start on a fresh MASTER_PORT and resume from the newest
    complete checkpoint there. A recovery without a first step within START_TIMEOUT s is
    printed and ends the run.
    """
    ckpt = workdir / "ckpt"
    shutil.rmtree(ckpt, ignore_errors=True)
    args = script_args(ckpt)
    seconds: list[float] = []
    with contextlib.ExitStack() as stack:
        procs, out = stack.enter_context(worker_group(NODES * NPROC, args))
        first = out.wait_for(STEP_LINE, time.monotonic() + START_TIMEOUT)
        for kill in range(kills):
            if first is None or not trained(out, first, 0.0):
                print(f"full restart {kill + 1}: not training: {out.tail()}", file=sys.stderr)
                break
            victim = workers_by_rank(proc.pid for proc in procs).get(victim_of(kill))
            if victim is None:
                print(f"full restart {kill + 1}: no rank {victim_of(kill)}", file=sys.stderr)
                break
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            stop_tree(procs, grace=0.0)  # the survivors, at once
            stack.close()
            procs, out = stack.enter_context(worker_group(NODES * NPROC, args))
            first = out.wait_for(STEP_LINE, killed + START_TIMEOUT)
            if first is not None:
                seconds.append(first[0] - killed)
    return seconds


# --- by hand -----------------------------------------------------------------------------


def _summary(seconds: list[float]) -> str:
    if not seconds:
        return "none"
    shown = ", ".join(f"{value:.2f}" for value in seconds)
    return f"median {statistics.median(seconds):.2f} s (of {shown})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kills", type=int, default=3, help="workers to kill per baseline")
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
        full = full_restart_recoveries(args.kills, workdir / "full")
        print(f"full restart of 4 cold workers, kill -> first step: {_summary(full)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
