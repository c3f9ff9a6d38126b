"""Recovery time after a worker is killed: resurge against the ways to restart without it.

For each variant the DDP example (examples/ddp, 2 x 2 workers, gloo on CPU) is trained,
one worker is SIGKILLed several times, and each recovery is timed from the kill (the
moment its agent saw the worker die) to the first completed step of the next
generation:

  (a) resurge, workers forked from the pre-warmed fork server (the default);
  (b) resurge with spec.forkServer false: every worker a new interpreter;
  (c) torchrun --max-restarts on the same script (bench/recovery_baselines.py);
  (d) a full restart: every worker relaunched cold from the checkpoint, the floor of
      any restart that recreates agents or pods (bench/recovery_baselines.py).

Prints the medians and each one as a ratio to (a), measured in the same run.

    .venv/bin/python bench/recovery.py [--kills 5] [--skip-baselines]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from resurge.bus import Bus
from resurge.client import inject_fault
from resurge.events import FaultDetected, Progress
from resurge.jobspec import EnvVar, TrainingJob, load_job
from resurge.local.story import Observed, Watch, run_job

REPO = Path(__file__).resolve().parents[1]
STEPS_BEFORE_KILL = 12


def bench_job(kills: int, fork_server: bool, checkpoints: Path) -> TrainingJob:
    job = load_job(REPO / "examples" / "ddp" / "job.yaml")
    steps = 20 + kills * (STEPS_BEFORE_KILL + 10) + 10
    command = [
        "python", "examples/ddp/train.py", "--steps", str(steps), "--checkpoint-every", "5",
        "--step-seconds", "0.02",
    ]  # fmt: skip
    env = [*job.spec.env, EnvVar(name="RESURGE_CHECKPOINT_DIR", value=str(checkpoints))]
    spec = job.spec.model_copy(
        update={
            "command": command,
            "env": env,
            "working_dir": str(REPO),
            "fork_server": fork_server,
            "recovery": job.spec.recovery.model_copy(update={"max_restarts": kills + 1}),
        }
    )
    return job.model_copy(update={"spec": spec})


async def kill_repeatedly(bus: Bus, watch: Watch, job: str, kills: int) -> None:
    for generation in range(kills):

        def ready(seen: list[Observed], generation: int = generation) -> bool:
            steps = [
                o.event.step
                for o in seen
                if isinstance(o.event, Progress) and o.event.generation == generation
            ]
            return len(set(steps)) >= STEPS_BEFORE_KILL

        await watch.wait_for(ready, wait_seconds=120)
        await inject_fault(bus, job, 1 + generation % 3, "crash")


async def resurge_recoveries(kills: int, fork_server: bool, workdir: Path) -> list[float]:
    job = bench_job(kills, fork_server, workdir / "ckpt")
    result = await run_job(
        job,
        state_dir=workdir,
        namespace="bench",
        nodes=2,
        gpus_per_node=2,
        wait_seconds=300,
        during=lambda bus, watch: kill_repeatedly(bus, watch, job.name, kills),
    )
    faults = [e for e in result.events(FaultDetected)]
    print(f"  job {result.phase}, {len(faults)} faults, {len(result.recoveries)} recoveries",
          flush=True)  # fmt: skip
    return result.latencies_after_exit(Progress)


def line(name: str, values: list[float], baseline: float | None) -> str:
    if not values:
        return f"{name:<44} {'no recovery':>10}"
    med = statistics.median(values)
    ratio = f"{med / baseline:>9.1f}x" if baseline else f"{'':>10}"
    return (f"{name:<44} {med:>10.3f} {min(values):>8.3f} {max(values):>8.3f} {len(values):>3}"
            f" {ratio}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--skip-baselines", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="resurge-bench-") as tmp:
        root = Path(tmp)
        print("(a) resurge, fork server", flush=True)
        results["(a) resurge, fork server"] = asyncio.run(
            resurge_recoveries(args.kills, True, root / "a")
        )
        print("(b) resurge, new interpreters", flush=True)
        results["(b) resurge, no fork server"] = asyncio.run(
            resurge_recoveries(args.kills, False, root / "b")
        )
        if not args.skip_baselines:
            sys.path.insert(0, str(Path(__file__).parent))
            from recovery_baselines import cold_start_recoveries, torchrun_recoveries

            print("(c) torchrun --max-restarts", flush=True)
            seconds, note = torchrun_recoveries(args.kills, root / "c")
            results["(c) torchrun --max-restarts"] = seconds
            notes.append(f"torchrun: {note}")
            print("(d) full restart (cold workers)", flush=True)
            results["(d) full restart, cold workers"] = cold_start_recoveries(
                args.kills, root / "d"
            )
    baseline = statistics.median(results["(a) resurge, fork server"] or [0.0]) or None
    print()
    print(f"{'kill -> first step of the next generation':<44} {'median s':>10} {'min s':>8} "
          f"{'max s':>8} {'n':>3} {'vs (a)':>10}")  # fmt: skip
    for name, values in results.items():
        print(line(name, values, baseline))
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
