"""Resize benchmark: how long a real resize of the DDP example stops its training.

A local cluster of 4 nodes x 1 simulated GPU runs the DDP example (examples/ddp, gloo on
CPU, one worker per replica, DCP checkpoints) as an elastic job of 2 to 4 replicas. It
starts at 4; a higher-priority fixed job of 2 replicas arrives, so the scaler shrinks
the example 4 -> 2 to admit it; when that job ends the example grows back 2 -> 4. That
cycle repeats ``--cycles`` times (default 3). The pause of each resize is the time from
the last step completed at the old size to the first step completed at the new one
(the workers' own Progress event times), so it holds the checkpoint taken for the
resize, stopping what goes, starting what comes, and the rendezvous.

Three ways to resize, in the same run:

- in-process: the example as it is (``resurge.worker.restartable``): ranks that stay
  re-enter their training function at the new world size, only added ranks start
  processes (forked from the agent's fork server);
- process: the example with ``--no-in-process``: every rank is a new process;
- resubmit (the baseline: what a fixed-size job needs, and what HyperPod's elastic
  training does by restarting every rank): the job is deleted and a job of the new
  size submitted (under a new name, so it starts from its first step: loading a
  checkpoint would add a little to its pause).

Printed: the median and each pause per way and direction, and each median as a ratio to
the resubmit median of the same direction (goal: in-process median <= 2 s). This is a
benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/resize_pause.py [--cycles N]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from resurge.control.effects.client import delete_job, submit_job
from resurge.events import Event, PhaseChanged, Progress, ScaleDecided
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import EXAMPLE, python_job
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "e2e" / "workers" / "progress_worker.py"
STEPS = 100_000  # the example never ends by itself: the benchmark deletes it
WAYS = ("resubmit", "in-process", "process")


@dataclass
class Pauses:
    """Seconds each resize stopped training, by direction (``4->2``, ``2->4``)."""

    by_direction: dict[str, list[float]] = field(default_factory=dict)

    def add(self, direction: str, seconds: float) -> None:
        self.by_direction.setdefault(direction, []).append(seconds)


def example(name: str, checkpoints: Path, replicas: dict[str, int], *extra: str) -> TrainingJob:
    args = ["--steps", str(STEPS), "--checkpoint-every", "20", "--step-seconds", "0.02"]
    args += ["--global-batch", "48", "--micro-batch", "4", "--log-every", "1000", *extra]
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


async def resubmit_cycles(
    bus: Bus, watch: Watch, checkpoints: Path, cycles: int, into: Pauses
) -> None:
    """Delete the job and submit it again at the other size (under a new name, so no
    event of the old one is taken for the new one's), ``2 * cycles`` times."""
    name, size = "resubmit-0", 4

    async def later_runs(event: Event, subject: str) -> None:  # the story watches only the first
        if event.job != "resubmit-0":
            await watch.add(Observed(subject=subject, event=event))

    await bus.subscribe(bus.subjects.raw(None, "progress", None), later_runs)
    await watch.wait_for(lambda seen: len(steps(seen, name)) >= 5, 180)
    for turn in range(1, 2 * cycles + 1):
        last = steps(watch.observed, name)[-1].time
        await delete_job(bus, name)
        name, size = f"resubmit-{turn}", 2 if size == 4 else 4
        await submit_job(bus, example(name, checkpoints / name, {"min": size}))

        def stepping(seen: list[Observed], job: str = name) -> bool:
            return bool(steps(seen, job))

        await watch.wait_for(stepping, 180)
        first = steps(watch.observed, name)[0].time
        into.add(f"{6 - size}->{size}", (first - last).total_seconds())
    await delete_job(bus, name)


async def measure(way: str, cycles: int, folder: Path) -> Pauses:
    pauses = Pauses()
    state, checkpoints = folder / way / "state", folder / way / "ckpt"
    if way == "resubmit":
        job = example("resubmit-0", checkpoints, {"min": 4})

        async def during(bus: Bus, watch: Watch) -> None:
            await resubmit_cycles(bus, watch, checkpoints, cycles, pauses)

    else:
        extra = ("--no-in-process",) if way == "process" else ()
        job = example("elastic", checkpoints, {"min": 2, "max": 4}, *extra)

        async def during(bus: Bus, watch: Watch) -> None:
            await elastic_cycles(bus, watch, job.name, cycles, pauses)

    await run_job(job, state_dir=state, namespace=f"bench-{way}", nodes=4, gpus_per_node=1,
                  wait_seconds=240 * cycles, during=during, end_with_during=True)  # fmt: skip
    return pauses


def report(way: str, pauses: Pauses, baseline: Pauses) -> None:
    """Print one way's pauses beside the resubmit baseline's, direction by direction."""
    for direction in ("4->2", "2->4"):
        values = pauses.by_direction.get(direction, [])
        if not values:
            print(f"  {direction} {way:>10}: no resize measured", flush=True)
            continue
        median = statistics.median(values)
        base = baseline.by_direction.get(direction, [])
        ratio = f"{median / statistics.median(base):4.2f}x resubmit" if base else "no baseline"
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"  {direction} {way:>10}: median {median:6.2f} s  ({ratio})  [{each}]", flush=True)
    if way == "in-process":
        every = [v for vs in pauses.by_direction.values() for v in vs]
        if every:
            median = statistics.median(every)
            verdict = "met" if median <= 2.0 else "NOT met"
            print(f"  goal: in-process median <= 2 s: {median:.2f} s, {verdict}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cycles", type=int, default=3, help="shrink-and-grow cycles per way")
    args = parser.parse_args()
    # SIGTERM (a `kill`, a timeout) ends it like Ctrl-C: the clusters it started are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    print("resize pause: last step at the old size -> first step at the new one", flush=True)
    with tempfile.TemporaryDirectory(prefix="resurge-resize-") as folder:
        baseline = Pauses()
        for way in WAYS:
            print(f"measuring {way} ...", file=sys.stderr, flush=True)
            pauses = asyncio.run(measure(way, args.cycles, Path(folder)))
            baseline = pauses if way == "resubmit" else baseline
            report(way, pauses, baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
