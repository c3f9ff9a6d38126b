"""Resize benchmark: how long a real resize of the DDP example stops its training.

The DDP example (examples/ddp/train.py, gloo on CPU, one worker per replica, DCP
checkpoints every 20 steps, 0.02 s of sleep per step, a global batch of 48 in
micro-batches of 4 at any size) runs on 4 nodes x 1 worker, shrinks 4 -> 2 and grows
back 2 -> 4, ``--cycles`` times (default 3). The pause of each resize is the time from
the last step completed at the old size to the first step completed at the new one, so
it holds the checkpoint taken for the resize, stopping what goes, starting what comes,
the rendezvous and the first step. Three ways, in the same run:

- in-process (resurge): a local cluster of 4 nodes x 1 simulated GPU runs the example as
  an elastic job of 2 to 4 replicas (``resurge.worker.restartable``); a higher-priority
  fixed job of 2 replicas arrives, the scaler shrinks the example to admit it, and grows
  it back when that job ends. Ranks that stay re-enter their training function at the
  new world size; only added ranks start processes (forked from the agent's fork
  server). Timed by the workers' own Progress events;
- process (resurge): the same with ``--no-in-process``: every rank is a new process;
- checkpoint-restart (the baseline: HyperPod's elastic training as its guide describes
  it, docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-eks-elastic-training.html,
  "Training code modification" and "Use-case examples": on a scaling event the operator
  sends the elastic event signal to the training processes, every rank saves a DCP
  checkpoint and exits, the operator waits for all processes to exit, then restarts the
  job at the new world size and every rank loads the latest checkpoint). Here without
  resurge: a torchrun job of the example, one torchrun agent per node (``--nnodes N
  --nproc-per-node 1``, c10d rendezvous, all on this machine), each worker running the
  script as that guide has it (``bench/hyperpod_elastic_worker.py``: on SIGUSR1 every
  rank saves at the same step and exits 0). At a resize the bench sends SIGUSR1 to every
  worker, waits for every agent to exit, and at once starts a torchrun job of the new
  size on the same checkpoint folder, which loads the newest checkpoint. Timed by rank
  0's ``step N loss`` lines as they arrive through a pipe.

What the baseline leaves out, each in its favour: the operator's own reaction (it is
relaunched the moment the last agent exits), pod deletion, scheduling, container start
and image pull (HyperPod creates a grow's new pods before it signals, so a grow waits for
them before the pause begins; a shrink deletes pods but keeps the others), Kueue
admission, and the signal's delivery (HyperPod's agent relays the operator's event).
What it counts that HyperPod may not: starting the torchrun agents again (a Python
process importing torch.distributed.run); hyperpodrun's agents, with their own
rendezvous, may outlive their workers. Also printed per baseline resize: the last
step to every agent's exit (the checkpoint and the exits), and the exit to the first step.

Printed: the median and each pause per way and direction, and each resurge way's median
as a ratio to the checkpoint-restart median of the same direction (goal: in-process
median <= 2 s). This is a benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/resize_pause.py [--cycles N] [--only WAY,WAY]

(ways: checkpoint-restart, in-process, process; a resurge way without the baseline prints
no ratio)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from resurge.control.effects.client import delete_job, submit_job
from resurge.events import PhaseChanged, Progress, ScaleDecided
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import EXAMPLE, python_job
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published import Figure, record
from torchrun_processes import REPO, STEP_LINE, TRAIN, TorchrunJob

WORKER = REPO / "tests" / "e2e" / "workers" / "progress_worker.py"
STEPS = 100_000  # the example never ends by itself: the benchmark deletes it
BASELINE = "checkpoint-restart"
WAYS = (BASELINE, "in-process", "process")
ELASTIC_WORKER = Path(__file__).resolve().parent / "hyperpod_elastic_worker.py"
ELASTIC_SIGNAL = signal.SIGUSR1  # HyperPod's elastic event, as its agent sends it
EXAMPLE_ARGS = ["--checkpoint-every", "20", "--step-seconds", "0.02", "--global-batch", "48",
                "--micro-batch", "4"]  # fmt: skip
TRAIN_BEFORE_RESIZE = 10  # steps at each size before the next resize (the baseline)
START_TIMEOUT = 180.0  # seconds a start or a stop may take on a loaded 2-core machine


@dataclass
class Pauses:
    """Seconds each resize stopped training, by direction (``4->2``, ``2->4``)."""

    by_direction: dict[str, list[float]] = field(default_factory=dict)
    parts: dict[str, list[Restart]] = field(default_factory=dict)  # the baseline's

    def add(self, direction: str, seconds: float) -> None:
        self.by_direction.setdefault(direction, []).append(seconds)


def example(name: str, checkpoints: Path, replicas: dict[str, int], *extra: str) -> TrainingJob:
    args = ["--steps", str(STEPS), *EXAMPLE_ARGS, "--log-every", "1000", *extra]
    return python_job(
        name, EXAMPLE.parent / "train.py", *args, nproc=1, preload=None, replicas=replicas,
        elastic={"cooldownSeconds": 1, "checkpointTimeoutSeconds": 10},
        env={"OMP_NUM_THREADS": "1", "RESURGE_CHECKPOINT_DIR": str(checkpoints)},
        workingDir=str(REPO),
    )  # fmt: skip


def urgent(cycle: int) -> TrainingJob:
    return python_job(
        f"urgent-{cycle}", WORKER, "--steps", "30", "--step-seconds", "0.1",
        nproc=1, replicas=2, priority=10,
    )  # fmt: skip


def steps(seen: list[Observed], job: str) -> list[Progress]:
    return [o.event for o in seen if isinstance(o.event, Progress) and o.event.job == job]


def stepped_since(seen: list[Observed], job: str, after: datetime, count: int = 3) -> bool:
    return len([p for p in steps(seen, job) if p.time > after]) >= count


def finished(seen: list[Observed], job: str) -> bool:
    return any(
        isinstance(o.event, PhaseChanged) and o.event.job == job and o.event.phase.finished
        for o in seen
    )


def pause_of(seen: list[Observed], job: str, old: int, new: int) -> float:
    """Last step of generation ``old`` to the first of ``new`` of ``job``, in seconds."""
    before = max(p.time for p in steps(seen, job) if p.generation == old)
    after = min(p.time for p in steps(seen, job) if p.generation == new)
    return (after - before).total_seconds()


async def elastic_cycles(bus: Bus, watch: Watch, job: str, cycles: int, into: Pauses) -> None:
    """Shrink by a higher-priority job and grow back, ``cycles`` times; the pauses."""
    await watch.wait_for(lambda seen: len(steps(seen, job)) >= 5, 180)
    for cycle in range(cycles):
        seen_before = len(watch.observed)
        await submit_job(bus, urgent(cycle))

        def urgent_done(seen: list[Observed], name: str = f"urgent-{cycle}") -> bool:
            return finished(seen, name)

        await watch.wait_for(urgent_done, 180)

        def regrown(seen: list[Observed], since: int = seen_before) -> bool:
            decided = [o.event for o in seen[since:] if isinstance(o.event, ScaleDecided)]
            grown = [d for d in decided if d.resize == "grow"]
            return bool(grown) and stepped_since(seen, job, grown[-1].time)

        await watch.wait_for(regrown, 180)
        for o in watch.observed[seen_before:]:
            if isinstance(o.event, ScaleDecided) and o.event.job == job:
                d = o.event
                seconds = pause_of(watch.observed, job, d.from_generation, d.to_generation)
                into.add(f"{d.from_replicas}->{d.to_replicas}", seconds)
    await delete_job(bus, job)


async def measure(way: str, cycles: int, folder: Path) -> Pauses:
    pauses = Pauses()
    state, checkpoints = folder / way / "state", folder / way / "ckpt"
    extra = ("--no-in-process",) if way == "process" else ()
    job = example("elastic", checkpoints, {"min": 2, "max": 4}, *extra)

    async def during(bus: Bus, watch: Watch) -> None:
        await elastic_cycles(bus, watch, job.name, cycles, pauses)

    await run_job(job, state_dir=state, namespace=f"bench-{way}", nodes=4, gpus_per_node=1,
                  wait_seconds=240 * cycles, during=during, end_with_during=True)  # fmt: skip
    return pauses


# The baseline: checkpoint and restart at the new size, as HyperPod's elastic training does.


@dataclass
class Restart:
    """One checkpoint-restart resize: monotonic seconds of its moments."""

    last_step: float  # the last step line at the old size (after the signal)
    exited: float  # every agent of the old size exited
    first_step: float  # the first step line at the new size

    @property
    def pause(self) -> float:
        return self.first_step - self.last_step


def hyperpod_job(size: int, checkpoints: Path) -> TorchrunJob:
    """The example at ``size`` nodes x 1 worker under torchrun, as HyperPod's guide has it."""
    args = [*EXAMPLE_ARGS, "--steps", str(STEPS), "--checkpoint-dir", str(checkpoints)]
    return TorchrunJob(
        nodes=size, nproc=1, script=ELASTIC_WORKER, args=[str(TRAIN.relative_to(REPO)), *args],
        program=["--no-python", sys.executable],
    )  # fmt: skip


def checkpoint_restart_cycles(cycles: int, checkpoints: Path, into: Pauses) -> None:
    """Start at 4; signal, wait for every exit, start at the other size, ``2 * cycles``
    times; each pause and its parts into ``into``."""
    size, turn = 4, 0
    with contextlib.ExitStack() as stack:
        job = stack.enter_context(hyperpod_job(size, checkpoints).running())
        while True:
            deadline = time.monotonic() + START_TIMEOUT
            if job.out.wait_for_steps(TRAIN_BEFORE_RESIZE, deadline) is None:
                print(f"  {size} nodes: no steps: {job.out.tail()}", flush=True)
                return
            if turn == 2 * cycles:
                return
            workers = job.workers()
            signalled = time.monotonic()
            for pid in workers.values():
                os.kill(pid, ELASTIC_SIGNAL)
            if len(workers) != size or not job.wait_exited(signalled + START_TIMEOUT):
                print(f"  {size} nodes: {len(workers)} workers signalled, not every agent "
                      f"exited: {job.out.tail()}", flush=True)  # fmt: skip
                return
            exited = time.monotonic()
            job.out.join(5.0)
            last = max(at for at, line in job.out.lines if STEP_LINE.match(line))
            stack.close()
            old, size, turn = size, 2 if size == 4 else 4, turn + 1
            job = stack.enter_context(hyperpod_job(size, checkpoints).running())
            first = job.out.wait_for(STEP_LINE, time.monotonic() + START_TIMEOUT)
            if first is None:
                print(f"  {old}->{size}: no first step: {job.out.tail()}", flush=True)
                return
            restart = Restart(last, exited, first[0])
            into.add(f"{old}->{size}", restart.pause)
            into.parts.setdefault(f"{old}->{size}", []).append(restart)


def report(way: str, pauses: Pauses, baseline: Pauses) -> None:
    """Print one way's pauses beside the checkpoint-restart baseline's, direction by direction."""
    for direction in ("4->2", "2->4"):
        values = pauses.by_direction.get(direction, [])
        if not values:
            print(f"  {direction} {way:>18}: no resize measured", flush=True)
            continue
        median = statistics.median(values)
        base = baseline.by_direction.get(direction, [])
        ratio = ""
        if pauses is not baseline:
            ratio = f"{median / statistics.median(base):5.3f}x baseline" if base else "no baseline"
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"  {direction} {way:>18}: median {median:6.2f} s  {ratio:>15}  [{each}]",
              flush=True)  # fmt: skip
        for part in pauses.parts.get(direction, []):
            print(f"      last step -> every agent exited {part.exited - part.last_step:5.2f} s "
                  "(the checkpoint, the exits), exited -> first step at the new size "
                  f"{part.first_step - part.exited:5.2f} s", flush=True)  # fmt: skip
    if way == "in-process":
        every = [v for vs in pauses.by_direction.values() for v in vs]
        if every:
            median = statistics.median(every)
            verdict = "met" if median <= 2.0 else "NOT met"
            print(f"  goal: in-process median <= 2 s: {median:.2f} s, {verdict}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cycles", type=int, default=3, help="shrink-and-grow cycles per way")
    parser.add_argument("--only", default=",".join(WAYS), help="comma-separated ways to run")
    args = parser.parse_args()
    only = [way for way in WAYS if way in args.only.split(",")]
    # SIGTERM (a `kill`, a timeout) ends it like Ctrl-C: the clusters it started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    print("resize pause: last step at the old size -> first step at the new one", flush=True)
    with tempfile.TemporaryDirectory(prefix="resurge-resize-") as folder:
        baseline = Pauses()
        measured: dict[str, Pauses] = {}
        for way in only:
            print(f"measuring {way} ...", file=sys.stderr, flush=True)
            pauses = Pauses()
            if way == BASELINE:
                checkpoint_restart_cycles(args.cycles, Path(folder) / way / "ckpt", pauses)
                baseline = pauses
            else:
                pauses = asyncio.run(measure(way, args.cycles, Path(folder)))
            report(way, pauses, baseline)
            measured[way] = pauses
    print(f"recorded in {record('resize_pause', figures(measured))}")
    return 0


def figures(measured: dict[str, Pauses]) -> dict[str, Figure]:
    """Each way's median pause per direction (``in_process_shrink_s``, ...), and its ratio
    to the checkpoint-restart baseline's (``in_process_shrink_x_baseline``)."""
    made: dict[str, Figure] = {}
    base = measured.get(BASELINE)
    for way, pauses in measured.items():
        for direction, label in (("4->2", "shrink"), ("2->4", "grow")):
            values = pauses.by_direction.get(direction, [])
            if not values:
                continue
            name = f"{way.replace('-', '_')}_{label}"
            median = statistics.median(values)
            made[f"{name}_s"] = (round(median, 2), "s")
            baseline = base.by_direction.get(direction, []) if base else []
            if baseline and pauses is not base:
                ratio = median / statistics.median(baseline)
                made[f"{name}_x_baseline"] = (round(ratio, 3), "x")
    return made


if __name__ == "__main__":
    sys.exit(main())
