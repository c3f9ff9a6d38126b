"""Chaos benchmark: the DDP example trains for a while as everything around it is broken.

A local cluster of 4 nodes x 1 simulated GPU runs the DDP example (examples/ddp, gloo on
CPU, one worker per replica under ``resurge.worker.restartable``, DCP checkpoints every
20 steps, its model and optimizer snapshotted to its nodes' memory every step with
``run.protect``) as an elastic job of 2 to 4 replicas, sized to train for about
``--minutes`` (default 20). ``--no-protect`` passes ``--no-protect`` to the example: no
snapshots, every restart and resize resumes from the disk checkpoint (the baseline).
Every ``--every`` seconds (default 15, jittered) one disturbance is picked at random:

- ``kill_rank``: SIGKILL one worker;              - ``exception``: one raised in a worker;
- ``stop_rank``: SIGSTOP one worker (a hang);     - ``log``: a CUDA error line in its output;
- ``kill_agent``: SIGKILL one replica's agent;    - ``xid``: a fatal XID (79) on a node,
- ``kill_service``: SIGKILL the detector,           replaced by a fresh node once the job moved;
  restarter or scaler (the supervisor starts it  - ``remove_node`` / ``add_node``: the
  again);                                           cluster shrinks by a node and grows back.

Faults that break the job (all but ``kill_service`` and the node changes) wait until the
job trains again (a newer generation reports a step; at most 120 s) before the next
disturbance, so each is one incident.

Printed at the end: the mode (peer recovery or disk only); disturbances by kind; faults
injected and detected; recoveries by level; resizes; the steps trained again at each
restart and at each resize (mean and max), measured from progress: the last step any
earlier generation reached less the step the new generation went on after (its first
step, less one), next to what a resume from the disk checkpoint the restarter assigned
would have trained again (the bound of a disk-only run); each new generation with its
cause, the disturbance before it and where its ranks' state came from (their
``restored`` reports); each service's memory (RSS) at start and end; and every
invariant broken:

- the job ends Succeeded at its final step;
- every injected fault is detected (a FaultDetected of the job after it and before the
  next disturbance, which waits for the job to train again);
- no fault is acted on twice (each RecoveryStarted names a fault once);
- generations only grow;
- no restart or resize trains more steps again than one checkpoint interval (plus the
  steps of the fault's own detection);
- memory is flat: no service's RSS at the end above 1.5 x its start + 30 MB.

This is a benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/chaos.py [--minutes 20] [--every 15] [--seed 1] [--no-protect]

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
    StateRestored,
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
CHECKPOINT_EVERY = 20  # the example's --checkpoint-every: the disk checkpoint interval
DETECTION_STEPS = 10  # steps a fault may train on before it is detected, over the bound


@dataclass
class Chaos:
    """What the disturbances did, for the report."""

    injected: list[tuple[str, datetime]] = field(default_factory=list)
    rss_start: dict[str, int] = field(default_factory=dict)
    rss_end: dict[str, int] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    broken_nodes: list[str] = field(default_factory=list)  # a fatal XID: replaced
    skipped: Counter[str] = field(default_factory=Counter)


def chaos_job(checkpoints: Path, minutes: float, every: int, protect: bool = True) -> TrainingJob:
    """The DDP example, elastic 2..4 replicas of one worker, about ``minutes`` long;
    ``protect``: its state snapshotted to memory (the example's default), else disk only."""
    steps = int(minutes * 60 / (STEP_SECONDS + 0.03))
    args = ["--steps", str(steps), "--checkpoint-every", str(every)]
    args += ["--step-seconds", str(STEP_SECONDS), "--global-batch", "48", "--micro-batch", "4"]
    args += ["--log-every", "500", *([] if protect else ["--no-protect"])]
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
    """The newest start of each worker process that is alive: a worker restarted
    in-process keeps its process and reports a start with its new rank, so a start
    is the newest of its pid, not of its rank (a resize gives ranks to other processes)."""
    newest: dict[int, ProcessStarted] = {}
    for o in watch.observed:
        if isinstance(o.event, ProcessStarted):
            newest[o.event.pid] = o.event
    return [start for start in newest.values() if _running(start.pid)]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X", "T")


def last_step(watch: Watch) -> int:
    return max((o.event.step for o in watch.observed if isinstance(o.event, Progress)), default=0)


def training_generation(watch: Watch) -> int:
    """The newest generation that reported a step (-1: none yet)."""
    return max(
        (
            o.event.generation
            for o in watch.observed
            if isinstance(o.event, Progress) and o.event.generation is not None
        ),
        default=-1,
    )


def trains_again(watch: Watch, broken: int, seen: object = None) -> bool:
    """Whether a generation newer than ``broken`` (the one training when a fault was
    made) reported a step: the job trains again. Steps of the broken generation itself
    still come in for a moment after the fault, and do not count."""
    return training_generation(watch) > broken


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
    minutes: float, every: float, seed: int, folder: Path, protect: bool = True
) -> tuple[StoryResult, Chaos, TrainingJob]:
    random.seed(seed)
    chaos = Chaos()
    job = chaos_job(folder / "ckpt", minutes, CHECKPOINT_EVERY, protect)
    deadline = time.monotonic() + minutes * 60 * 0.85

    async def during(bus: Bus, watch: Watch) -> None:
        supervisor = watch.supervisor
        assert supervisor is not None
        await watch.wait_for(partial(trains_again, watch, -1), 180)
        chaos.rss_start = service_rss(supervisor)
        total = int(job.spec.command[job.spec.command.index("--steps") + 1])
        while time.monotonic() < deadline and last_step(watch) < 0.9 * total:
            await asyncio.sleep(every * random.uniform(0.6, 1.4))  # the pace of chaos
            kind = random.choice(KINDS)
            now, broken = datetime.now(UTC), training_generation(watch)
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
                with contextlib.suppress(TimeoutError):
                    await watch.wait_for(partial(trains_again, watch, broken), 120)
                if kind == "xid":  # a node with a fatal XID is replaced, as in a cluster
                    await replace_node(bus, folder, chaos.broken_nodes[-1], chaos)
        chaos.rss_end = service_rss(supervisor)

    result = await run_job(
        job, state_dir=folder, namespace="chaos", nodes=4, gpus_per_node=1,
        wait_seconds=minutes * 60 + 900, during=during,
    )  # fmt: skip
    return result, chaos, job


def report(result: StoryResult, chaos: Chaos, job: TrainingJob, protect: bool = True) -> int:
    every = CHECKPOINT_EVERY
    broken: list[str] = []
    final = max((e.step for e in result.events(Progress) if e.job == job.name), default=0)
    total = int(job.spec.command[job.spec.command.index("--steps") + 1])
    if result.phase is not JobPhase.SUCCEEDED or final != total:
        broken.append(f"the job ended {result.phase} at step {final} of {total}")
    faults = [f for f in result.events(FaultDetected) if f.job == job.name]
    breaking = [(kind, at) for kind, at in chaos.injected if kind in BREAKING]
    undetected = undetected_faults(chaos.injected, faults)
    if undetected:
        broken.append(f"undetected: {', '.join(undetected)}")
    started = [r for r in result.events(RecoveryStarted) if r.job == job.name]
    twice = [fid for fid, n in Counter(r.fault_id for r in started).items() if n > 1]
    if twice:
        broken.append(f"faults acted on twice: {twice}")
    generations = [a.generation for a in result.events(Assign) if a.job == job.name]
    if any(b < a for a, b in itertools.pairwise(generations)):
        broken.append("a generation went backwards")
    news = new_generations(result, job.name, chaos.injected)
    over = [n.redone for n in news if n.redone > every + DETECTION_STEPS]
    if over:
        broken.append(f"restarts or resizes trained more than a checkpoint interval again: {over}")
    for name, start in chaos.rss_start.items():
        end = chaos.rss_end.get(name, 0)
        if end > 1.5 * start + 30 * 2**20:
            broken.append(f"{name} grew from {start / 2**20:.0f} to {end / 2**20:.0f} MiB")
    print("\n=== chaos ===")
    if protect:
        print("mode: peer recovery (the example's run.protect: its state in its nodes' memory)")
    else:
        print("mode: disk only (the example with --no-protect)")
    print(f"disturbances: {dict(Counter(kind for kind, _ in chaos.injected))}")
    print(f"not possible at the moment drawn (skipped): {dict(chaos.skipped)}")
    print(f"faults injected (breaking the job): {len(breaking)}; faults detected: {len(faults)}")
    print(f"detected by reason: {dict(Counter(f.reason for f in faults))}")
    print(f"recoveries by level: {dict(Counter(r.level.value for r in started))}")
    print(f"resizes: {dict(Counter(s.resize for s in result.events(ScaleDecided)))}")
    print(
        f"steps trained again (disk checkpoint every {every}; "
        f"bound {every + DETECTION_STEPS}), from the assigned disk checkpoint in brackets:"
    )
    for label, group in (
        ("per restart", [n for n in news if not n.resize]),
        ("per resize", [n for n in news if n.resize]),
        ("in all", news),
    ):
        print(f"  {label} ({len(group)}): {_spread([n.redone for n in group])} "
              f"[{_spread([n.from_disk for n in group if n.from_disk is not None])}]")  # fmt: skip
    by_kind: dict[str, list[int]] = {}
    for n in news:
        by_kind.setdefault(n.disturbance or "none", []).append(n.redone)
    print(f"  by the disturbance before: {by_kind}")
    unseen = sum(1 for n in news if n.progress_unseen)
    if unseen:
        print(f"  ({unseen} whose last steps reached were known only from the restored step)")
    print("each new generation:")
    for n in news:
        print(f"  {n}")
    for name in SERVICES:
        start, end = chaos.rss_start.get(name, 0), chaos.rss_end.get(name, 0)
        print(f"RSS {name}: {start / 2**20:.1f} MiB at start, {end / 2**20:.1f} MiB at end")
    print(f"job: {result.phase} at step {final} of {total}")
    print("invariants broken: " + ("none" if not broken else ""))
    for line in broken:
        print(f"  - {line}")
    return 0 if not broken else 1


def undetected_faults(
    injected: list[tuple[str, datetime]], faults: list[FaultDetected]
) -> list[str]:
    """Each breaking disturbance with no fault detected after it and before the next one
    (any later fault, another disturbance's, would hide a fault that went nowhere)."""
    undetected = []
    ends = [at for _, at in injected[1:]] + [datetime.max.replace(tzinfo=UTC)]
    for (kind, at), until in zip(injected, ends, strict=False):
        if kind in BREAKING and not any(at <= f.time < until for f in faults):
            undetected.append(f"{kind} at {at:%H:%M:%S}")
    return undetected


def _spread(values: list[int]) -> str:
    if not values:
        return "none"
    return f"mean {sum(values) / len(values):.1f}, max {max(values)}, each {values}"


@dataclass
class NewGeneration:
    """A generation that trained after an earlier one had: what it cost and why it came."""

    generation: int
    cause: str  # "restart (process)", "resize (grow)", or "?" when no event said
    resize: bool
    disturbance: str  # the last one injected before its Assign ("" for none)
    disturbed_seconds_before: float | None
    redone: int  # steps trained again, measured from progress
    from_disk: int | None  # the same from the disk checkpoint its Assign named
    restored: Counter[str]  # its ranks' restored reports: origin -> ranks
    restored_steps: list[int | None]
    progress_unseen: int = 0  # steps restored that no progress report of before showed

    def __str__(self) -> str:
        before = ""
        if self.disturbance:
            before = f" after {self.disturbance} ({self.disturbed_seconds_before:.0f} s before)"
        origins = ", ".join(f"{origin} {n}" for origin, n in sorted(self.restored.items()))
        steps = sorted({s for s in self.restored_steps if s is not None})
        disk = "?" if self.from_disk is None else self.from_disk
        return (
            f"generation {self.generation}: {self.cause}{before}: {self.redone} steps again "
            f"(from the disk: {disk}); restored: {origins or 'no report'}"
            + (f" at step {', '.join(map(str, steps))}" if steps else "")
            + (f" ({self.progress_unseen} step(s) reached unseen)" if self.progress_unseen else "")
        )


def new_generations(
    result: StoryResult, job: str, injected: list[tuple[str, datetime]]
) -> list[NewGeneration]:
    """Each generation that trained after another had, with the steps it trained again:
    the last step any earlier generation reached less the step it went on after (its
    first step, less one), as progress shows it, whether it resumed from memory, a peer
    or the disk; beside it, the same from the disk checkpoint the restarter assigned.
    Progress is best-effort: a rank killed right after a step may never report it, so
    the step its new generation restored (which an earlier one reached) counts as
    reached too."""
    steps: dict[int, list[int]] = {}
    first_seen: dict[int, datetime] = {}
    for event in result.events(Progress):
        if event.job == job and event.generation is not None:
            steps.setdefault(event.generation, []).append(event.step)
            first_seen.setdefault(event.generation, event.time)
    assigns: dict[int, Assign] = {}
    for command in result.events(Assign):
        if command.job == job:
            assigns.setdefault(command.generation, command)
    causes = {
        r.to_generation: (f"restart ({r.level.value})", False)
        for r in result.events(RecoveryStarted)
        if r.job == job
    }
    causes |= {
        s.to_generation: (f"resize ({s.resize})", True)
        for s in result.events(ScaleDecided)
        if s.job == job
    }
    restored: dict[int, list[StateRestored]] = {}
    for report in result.events(StateRestored):
        if report.job == job and report.generation is not None:
            restored.setdefault(report.generation, []).append(report)
    news: list[NewGeneration] = []
    reached: int | None = None
    for generation in sorted(steps):
        if reached is not None:
            assign = assigns.get(generation)
            at = assign.time if assign is not None else first_seen[generation]
            before = [(kind, when) for kind, when in injected if when <= at]
            kind, when = before[-1] if before else ("", at)
            cause, resize = causes.get(generation, ("?", False))
            reports = restored.get(generation, [])
            seen = reached
            reached = max([reached, *(r.step for r in reports if r.step is not None)])
            news.append(
                NewGeneration(
                    generation=generation,
                    cause=cause,
                    resize=resize,
                    disturbance=kind,
                    disturbed_seconds_before=(at - when).total_seconds() if before else None,
                    redone=reached - (min(steps[generation]) - 1),
                    from_disk=None if assign is None else reached - (assign.resume_step or 0),
                    restored=Counter(r.origin for r in reports),
                    restored_steps=[r.step for r in reports],
                    progress_unseen=reached - seen,
                )
            )
        reached = max(reached or 0, *steps[generation])
    return news


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="training time (default 20)")
    parser.add_argument("--every", type=float, default=None, help="seconds between disturbances")
    parser.add_argument("--seed", type=int, default=None, help="default: 1 (control plane: random)")
    parser.add_argument(
        "--control-plane", action="store_true", help="the control plane's own chaos (see above)"
    )
    parser.add_argument(
        "--no-protect",
        action="store_true",
        help="the example without run.protect: every restart and resize resumes from the "
        "disk checkpoint (the baseline)",
    )
    args = parser.parse_args()
    if args.control_plane:
        from chaos_control_plane import main as control_plane

        return control_plane(args.minutes, args.every, args.seed)
    args.every = 15.0 if args.every is None else args.every
    args.seed = 1 if args.seed is None else args.seed
    with tempfile.TemporaryDirectory(prefix="resurge-chaos-") as folder:
        protect = not args.no_protect
        result, chaos, job = asyncio.run(
            run_chaos(args.minutes, args.every, args.seed, Path(folder), protect)
        )
        return report(result, chaos, job, protect)


if __name__ == "__main__":
    sys.exit(main())
