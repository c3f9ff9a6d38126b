"""Chaos benchmark: the DDP example trains for a while as everything around it is broken.

A local cluster of 4 nodes x 1 simulated GPU runs the DDP example (examples/ddp, gloo on
CPU, one worker per replica under ``resurge.worker.restartable``, DCP checkpoints every
``--checkpoint-every`` steps) as an elastic job of 2 to 4 replicas, sized to train for
about ``--minutes`` (default 20). Every ``--every`` seconds (default 15, jittered) one
disturbance is picked at random:

- ``kill_rank``: SIGKILL one worker;              - ``exception``: one raised in a worker;
- ``stop_rank``: SIGSTOP one worker (a hang);     - ``log``: a CUDA error line in its output;
- ``kill_agent``: SIGKILL one replica's agent;    - ``xid``: a fatal XID (79) on a node,
- ``kill_service``: SIGKILL the detector,           replaced by a fresh node once the job moved;
  restarter or scaler (the supervisor starts it  - ``remove_node`` / ``add_node``: the
  again);                                           cluster shrinks by a node and grows back.

Faults that break the job (all but ``kill_service`` and the node changes) wait until the
job trains again before the next disturbance, so each is one incident.

Printed at the end: disturbances by kind; faults injected and detected; recoveries by
level; resizes; steps lost at each restart against the checkpoint bound; each
service's memory (RSS) at start and end; and every invariant broken:

- the job ends Succeeded at its final step;
- every injected fault is detected (a FaultDetected of the job after it);
- no fault is acted on twice (each RecoveryStarted names a fault once);
- generations only grow;
- no restart loses more steps than one checkpoint interval (plus the steps of the
  fault's own detection);
- memory is flat: no service's RSS at the end above 1.5 x its start + 30 MB.

This is a benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/chaos.py [--minutes 20] [--every 15] [--seed 1]

``--control-plane`` runs the control plane's own chaos instead (proxies between each
service and NATS that partition and delay, failed publishes, the detector killed during
a hang, two scalers and two restarters, a wall-clock step; four invariants checked at
every moment): :mod:`chaos_control_plane` says what it does. Its seed is random unless
given, and printed; ``--every`` defaults to 8 s there.

    .venv/bin/python bench/chaos.py --control-plane [--minutes 20] [--seed N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from resurge.control.effects.client import inject_fault, inject_xid
from resurge.events import (
    Assign,
    FaultDetected,
    JobPhase,
    ProcessStarted,
    Progress,
    RecoveryStarted,
    ScaleDecided,
)
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import EXAMPLE, python_job
from resurge.local.membership import add_node, remove_node
from resurge.local.story import StoryResult, Watch, run_job
from resurge.local.supervisor import Supervisor
from resurge.runtime.bus import Bus

REPO = Path(__file__).resolve().parents[1]
STEP_SECONDS = 0.1
SERVICES = ("detector", "restarter", "scaler")
BREAKING = ("kill_rank", "stop_rank", "exception", "log", "kill_agent", "xid")
KINDS = (*BREAKING, "kill_service", "remove_node")
CUDA_LINE = "RuntimeError: CUDA error: an illegal memory access was encountered"


@dataclass
class Chaos:
    """What the disturbances did, for the report."""

    injected: list[tuple[str, datetime]] = field(default_factory=list)
    rss_start: dict[str, int] = field(default_factory=dict)
    rss_end: dict[str, int] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    broken_nodes: list[str] = field(default_factory=list)  # a fatal XID: replaced
    skipped: Counter[str] = field(default_factory=Counter)


def chaos_job(checkpoints: Path, minutes: float, every: int) -> TrainingJob:
    """The DDP example, elastic 2..4 replicas of one worker, about ``minutes`` long."""
    steps = int(minutes * 60 / (STEP_SECONDS + 0.03))
    args = ["--steps", str(steps), "--checkpoint-every", str(every)]
    args += ["--step-seconds", str(STEP_SECONDS), "--global-batch", "48", "--micro-batch", "4"]
    args += ["--log-every", "500"]
    return python_job(
        "chaos", EXAMPLE.parent / "train.py", *args, nproc=1, preload=None,
        replicas={"min": 2, "max": 4}, elastic={"cooldownSeconds": 5, "scaleUpSnoozeSeconds": 5},
        recovery={"jobMaxRetryCount": 1000, "evalPeriodSeconds": 5},
        monitoring={"heartbeatTimeoutSeconds": 10, "logRules": [
            {"name": "cuda", "logPattern": "CUDA error", "faultOnMatch": True},
        ]},
        env={"OMP_NUM_THREADS": "1", "RESURGE_CHECKPOINT_DIR": str(checkpoints)},
        workingDir=str(REPO),
    )  # fmt: skip


def rss_of(pid: int | None) -> int:
    """Resident memory of ``pid`` in bytes (0 if it is gone)."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def service_rss(supervisor: Supervisor) -> dict[str, int]:
    return {
        name: rss_of(child.process.pid if child.process else None)
        for name, child in supervisor.children.items()
        if name in SERVICES
    }


def live_workers(watch: Watch) -> list[ProcessStarted]:
    """The newest start of each rank whose process is alive (workers restarted
    in-process keep their processes and start no new one)."""
    newest: dict[int | None, ProcessStarted] = {}
    for o in watch.observed:
        if isinstance(o.event, ProcessStarted):
            newest[o.event.rank] = o.event
    return [start for start in newest.values() if _running(start.pid)]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X", "T")


def last_step(watch: Watch) -> int:
    return max((o.event.step for o in watch.observed if isinstance(o.event, Progress)), default=0)


def trains_after(watch: Watch, since: datetime, seen: object = None) -> bool:
    """Whether a worker reported a step after ``since`` (``seen``: what wait_for passes)."""
    return any(isinstance(o.event, Progress) and o.event.time > since for o in watch.observed)


async def disturb(kind: str, bus: Bus, watch: Watch, state_dir: Path, chaos: Chaos) -> bool:
    """Do one disturbance of ``kind``; False if there was nothing to do it to now."""
    supervisor = watch.supervisor
    assert supervisor is not None
    starts = live_workers(watch)
    if kind in ("kill_rank", "stop_rank", "exception", "log") and not starts:
        return False
    victim = random.choice(starts) if starts else None
    if kind == "kill_rank" and victim is not None:
        os.kill(victim.pid, signal.SIGKILL)
    elif kind == "stop_rank" and victim is not None:
        os.kill(victim.pid, signal.SIGSTOP)
    elif kind in ("exception", "log") and victim is not None:
        assert victim.rank is not None and victim.job is not None
        await inject_fault(bus, victim.job, victim.rank, kind, CUDA_LINE if kind == "log" else "")
    elif kind == "kill_agent" and victim is not None:
        agents = [
            pid
            for pid in _pids_named("resurge_node_agent launch")
            if f"{victim.node}" in _environ_node(pid)
        ]
        if not agents:
            return False
        os.kill(agents[0], signal.SIGKILL)
    elif kind == "xid" and victim is not None and victim.node is not None:
        await inject_xid(bus, victim.node, 0, 79)
        chaos.broken_nodes.append(victim.node)
    elif kind == "kill_service":
        child = supervisor.children[random.choice(SERVICES)]
        if child.process is None or child.process.poll() is not None:
            return False
        os.kill(child.process.pid, signal.SIGKILL)
    elif kind == "remove_node":
        nodes = [n for n in supervisor.node_names if n not in chaos.removed]
        if len(nodes) <= 2:
            return False
        name = nodes[-1]
        await remove_node(bus, state_dir, name, 120)
        chaos.removed.append(name)
        await add_node(bus, state_dir, 1, {}, 60)  # and the cluster grows back
    else:
        return False
    return True


def _pids_named(fragment: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if fragment in cmdline:
                found.append(int(entry.name))
    return found


def _environ_node(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n")).decode()
    except OSError:
        return ""


async def replace_node(bus: Bus, state_dir: Path, name: str, chaos: Chaos) -> None:
    """Take the broken node out (once the job has left it) and add a fresh one."""
    try:
        await remove_node(bus, state_dir, name, 120)
    except Exception as error:  # still in use: it stays, cordoned, and a node is added
        print(f"  could not remove {name}: {error}", file=sys.stderr, flush=True)
    else:
        chaos.removed.append(name)
    await add_node(bus, state_dir, 1, {}, 60)


async def run_chaos(
    minutes: float, every: float, seed: int, folder: Path
) -> tuple[StoryResult, Chaos, TrainingJob]:
    random.seed(seed)
    chaos = Chaos()
    job = chaos_job(folder / "ckpt", minutes, every=20)
    deadline = time.monotonic() + minutes * 60 * 0.85

    async def during(bus: Bus, watch: Watch) -> None:
        supervisor = watch.supervisor
        assert supervisor is not None
        await watch.wait_for(
            lambda seen: trains_after(watch, datetime.min.replace(tzinfo=UTC)), 180
        )
        chaos.rss_start = service_rss(supervisor)
        total = int(job.spec.command[job.spec.command.index("--steps") + 1])
        while time.monotonic() < deadline and last_step(watch) < 0.9 * total:
            await asyncio.sleep(every * random.uniform(0.6, 1.4))  # the pace of chaos
            kind = random.choice(KINDS)
            now = datetime.now(UTC)
            try:
                done = await disturb(kind, bus, watch, folder, chaos)
            except Exception as error:  # a disturbance that could not be made is no result
                print(f"  {kind}: could not: {error}", file=sys.stderr, flush=True)
                done = False
            if not done:
                chaos.skipped[kind] += 1
                continue
            chaos.injected.append((kind, now))
            print(f"  {now:%H:%M:%S} {kind}", file=sys.stderr, flush=True)
            if kind in BREAKING:  # one incident at a time: wait until it trains again
                after = datetime.now(UTC)
                with contextlib.suppress(TimeoutError):
                    await watch.wait_for(partial(trains_after, watch, after), 120)
                if kind == "xid":  # a node with a fatal XID is replaced, as in a cluster
                    await replace_node(bus, folder, chaos.broken_nodes[-1], chaos)
        chaos.rss_end = service_rss(supervisor)

    result = await run_job(
        job, state_dir=folder, namespace="chaos", nodes=4, gpus_per_node=1,
        wait_seconds=minutes * 60 + 900, during=during,
    )  # fmt: skip
    return result, chaos, job


def report(result: StoryResult, chaos: Chaos, job: TrainingJob, every: int) -> int:
    broken: list[str] = []
    final = max((e.step for e in result.events(Progress) if e.job == job.name), default=0)
    total = int(job.spec.command[job.spec.command.index("--steps") + 1])
    if result.phase is not JobPhase.SUCCEEDED or final != total:
        broken.append(f"the job ended {result.phase} at step {final} of {total}")
    faults = [f for f in result.events(FaultDetected) if f.job == job.name]
    breaking = [(kind, at) for kind, at in chaos.injected if kind in BREAKING]
    undetected = [
        f"{kind} at {at:%H:%M:%S}" for kind, at in breaking if not any(f.time >= at for f in faults)
    ]
    if undetected:
        broken.append(f"undetected: {', '.join(undetected)}")
    started = [r for r in result.events(RecoveryStarted) if r.job == job.name]
    twice = [fid for fid, n in Counter(r.fault_id for r in started).items() if n > 1]
    if twice:
        broken.append(f"faults acted on twice: {twice}")
    generations = [a.generation for a in result.events(Assign) if a.job == job.name]
    if any(b < a for a, b in itertools.pairwise(generations)):
        broken.append("a generation went backwards")
    lost = steps_lost(result, job.name)
    over = [n for n in lost if n > every + 10]
    if over:
        broken.append(f"restarts lost more than a checkpoint interval: {over}")
    for name, start in chaos.rss_start.items():
        end = chaos.rss_end.get(name, 0)
        if end > 1.5 * start + 30 * 2**20:
            broken.append(f"{name} grew from {start / 2**20:.0f} to {end / 2**20:.0f} MiB")
    print("\n=== chaos ===")
    print(f"disturbances: {dict(Counter(kind for kind, _ in chaos.injected))}")
    print(f"not possible at the moment drawn (skipped): {dict(chaos.skipped)}")
    print(f"faults injected (breaking the job): {len(breaking)}; faults detected: {len(faults)}")
    print(f"detected by reason: {dict(Counter(f.reason for f in faults))}")
    print(f"recoveries by level: {dict(Counter(r.level.value for r in started))}")
    print(f"resizes: {dict(Counter(s.resize for s in result.events(ScaleDecided)))}")
    print(f"steps lost per restart (checkpoint every {every}): {lost}")
    for name in SERVICES:
        start, end = chaos.rss_start.get(name, 0), chaos.rss_end.get(name, 0)
        print(f"RSS {name}: {start / 2**20:.1f} MiB at start, {end / 2**20:.1f} MiB at end")
    print(f"job: {result.phase} at step {final} of {total}")
    print("invariants broken: " + ("none" if not broken else ""))
    for line in broken:
        print(f"  - {line}")
    return 0 if not broken else 1


def steps_lost(result: StoryResult, job: str) -> list[int]:
    """At each new generation: the highest step before it less the step it resumed at."""
    lost = []
    highest, generation = 0, None
    for event in result.events(Progress):
        if event.job != job or event.rank != 0:
            continue
        if generation is not None and event.generation != generation:
            lost.append(max(highest - event.step + 1, 0))
        generation = event.generation
        highest = max(highest, event.step)
    return lost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="training time (default 20)")
    parser.add_argument("--every", type=float, default=None, help="seconds between disturbances")
    parser.add_argument("--seed", type=int, default=None, help="default: 1 (control plane: random)")
    parser.add_argument(
        "--control-plane", action="store_true", help="the control plane's own chaos (see above)"
    )
    args = parser.parse_args()
    if args.control_plane:
        from chaos_control_plane import main as control_plane

        return control_plane(args.minutes, args.every, args.seed)
    args.every = 15.0 if args.every is None else args.every
    args.seed = 1 if args.seed is None else args.seed
    with tempfile.TemporaryDirectory(prefix="resurge-chaos-") as folder:
        result, chaos, job = asyncio.run(
            run_chaos(args.minutes, args.every, args.seed, Path(folder))
        )
        return report(result, chaos, job, every=20)


if __name__ == "__main__":
    sys.exit(main())
