"""Recovery time after a worker fails: resurge against the ways to restart without it.

For each variant the DDP example (examples/ddp, 2 x 2 workers, gloo on CPU) is trained,
one worker is broken several times (rotating ranks), and each recovery is timed to the
first completed step of the next generation:

  (a) resurge, workers forked from the pre-warmed fork server (the default);
  (b) resurge with spec.forkServer false: every worker a new interpreter;
  (c) torchrun --max-restarts on the same script (bench/recovery_baselines.py);
  (d) a full restart: every worker relaunched cold from the checkpoint, the floor of
      any restart that recreates agents or pods (bench/recovery_baselines.py);
  (e) resurge in-process restart: an exception raised in a worker's training function
      (``resurge inject exception``), recovery.levels [in_process]: no process exits;
  (f) the same exception with recovery.levels [process]: a fork-server process restart;
  (g) resurge with the job's default recovery policy (every level, default backoff):
      independent kills of rotating ranks, each after the job trained again, as a long
      job meets them; each must stay a process restart with no backoff, as fast as (a);
  (h) a SIGSTOPped worker (``resurge inject hang``) under a log rule that expects a
      step line every 3 s, default policy: timed from the stop; the goal is the rule's
      3 s plus at most 1.5 s (a stopped worker is killed at once, not after a grace).

(a) to (d) and (g) SIGKILL the worker and are timed from the kill (the moment its agent
saw the worker die); (e) and (f) are timed from the moment the agent received the worker's
exception report (the fault's ``reported_at``). Each resurge variant allows one
recovery level and no backoff, so every recovery is at that level and the mechanism is
measured, not the ladder's escalation or crash-loop delays.

Prints the medians and each one as a ratio to (a), measured in the same run.

    .venv/bin/python bench/recovery.py [--kills 5] [--skip-baselines] [--only a,g,h]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from resurge.control.client import inject_fault
from resurge.events import FaultDetected, Progress, RecoveryLevel
from resurge.jobspec import BackoffSpec, LogRule, TrainingJob
from resurge.local.job_factory import ddp_example_job
from resurge.local.story import Observed, StoryResult, Watch, run_job
from resurge.runtime.bus import Bus

STEPS_BEFORE_KILL = 12


HANG_RULE_SECONDS = 3.0


def bench_job(
    kills: int,
    fork_server: bool,
    checkpoints: Path,
    level: RecoveryLevel | None = RecoveryLevel.PROCESS,
    hang_rule: bool = False,
) -> TrainingJob:
    """The DDP example; ``level`` None keeps the job's default recovery policy."""
    example = ddp_example_job(checkpoints).spec
    steps = 20 + kills * (STEPS_BEFORE_KILL + 10) + 10
    command = [
        "python", "examples/ddp/train.py", "--steps", str(steps), "--checkpoint-every", "5",
        "--step-seconds", "0.02",
    ]  # fmt: skip
    recovery = example.recovery
    if level is not None:
        recovery = recovery.model_copy(
            update={
                "max_restarts": kills + 1,
                # A single rung is the top one, whose per-window limit is 3 unless set.
                "max_restarts_per_level": {level: kills + 1},
                "levels": [level],
                "backoff": BackoffSpec(initial_seconds=0.0, max_seconds=0.0),
            }
        )
    monitoring = example.monitoring
    if hang_rule:
        rule = LogRule(name="steps", log_pattern=r"^step \d+ loss",
                       expected_recurring_frequency_in_seconds=HANG_RULE_SECONDS)  # fmt: skip
        monitoring = monitoring.model_copy(update={"log_rules": [rule]})
    return ddp_example_job(
        checkpoints,
        command=command,
        fork_server=fork_server,
        recovery=recovery,
        monitoring=monitoring,
    )


async def break_repeatedly(
    bus: Bus, watch: Watch, job: str, kills: int, fault: str = "crash",
    broken_at: list[datetime] | None = None,
) -> None:  # fmt: skip
    for generation in range(kills):

        def ready(seen: list[Observed], generation: int = generation) -> bool:
            steps = [
                o.event.step
                for o in seen
                if isinstance(o.event, Progress) and o.event.generation == generation
            ]
            return len(set(steps)) >= STEPS_BEFORE_KILL

        await watch.wait_for(ready, wait_seconds=120)
        if broken_at is not None:
            broken_at.append(datetime.now(UTC))
        await inject_fault(bus, job, 1 + generation % 3, fault)


def latencies_after(result: StoryResult, broken_at: list[datetime]) -> list[float]:
    """Seconds from each break (generation g) to the first step of generation g + 1."""
    latencies = []
    for generation, at in enumerate(broken_at):
        after = [
            o.event.time
            for o in result.observed
            if isinstance(o.event, Progress) and o.event.generation == generation + 1
        ]
        if after:
            latencies.append((min(after) - at).total_seconds())
    return latencies


def latencies_after_report(result: StoryResult) -> list[float]:
    """Seconds from each generation's first worker exception report (the fault's
    ``reported_at``) to the first completed step of the next generation."""
    reported: dict[int, datetime] = {}
    for fault in result.faults:
        at = fault.evidence.get("reported_at")
        if (
            fault.reason == "worker_exception"
            and isinstance(at, str)
            and fault.generation is not None
        ):
            time = datetime.fromisoformat(at)
            reported[fault.generation] = min(time, reported.get(fault.generation, time))
    latencies = []
    for generation, first in sorted(reported.items()):
        after = [
            o.event.time
            for o in result.observed
            if isinstance(o.event, Progress) and o.event.generation == generation + 1
        ]
        if after:
            latencies.append((min(after) - first).total_seconds())
    return latencies


async def resurge_recoveries(
    kills: int,
    fork_server: bool,
    workdir: Path,
    fault: str = "crash",
    level: RecoveryLevel | None = RecoveryLevel.PROCESS,
) -> list[float]:
    job = bench_job(kills, fork_server, workdir / "ckpt", level, hang_rule=fault == "hang")
    broken_at: list[datetime] = []
    result = await run_job(
        job,
        state_dir=workdir,
        namespace="bench",
        nodes=2,
        gpus_per_node=2,
        wait_seconds=300,
        during=lambda bus, watch: break_repeatedly(bus, watch, job.name, kills, fault, broken_at),
    )
    faults = [e for e in result.events(FaultDetected)]
    levels = sorted({str(r.level) for r in result.recoveries})
    print(f"  job {result.phase}, {len(faults)} faults, {len(result.recoveries)} recoveries "
          f"at {', '.join(levels) or '-'}", flush=True)  # fmt: skip
    if fault == "exception":
        return latencies_after_report(result)
    if fault == "hang":
        return latencies_after(result, broken_at)
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
    parser.add_argument(
        "--only", default="a,b,c,d,e,f,g,h", help="comma-separated variants to run (default all)"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    results: dict[str, list[float]] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="resurge-bench-") as tmp:
        root = Path(tmp)
        resurge_variants = [
            ("a", "(a) resurge, fork server", True, "crash", RecoveryLevel.PROCESS),
            ("b", "(b) resurge, no fork server", False, "crash", RecoveryLevel.PROCESS),
            ("e", "(e) resurge, in-process (exception)", True, "exception",
             RecoveryLevel.IN_PROCESS),
            ("f", "(f) resurge, fork server (exception)", True, "exception",
             RecoveryLevel.PROCESS),
            ("g", "(g) resurge, default policy, independent", True, "crash", None),
            ("h", "(h) SIGSTOP, 3 s log rule, from the stop", True, "hang", None),
        ]  # fmt: skip
        for key, name, fork_server, fault, level in resurge_variants:
            if key in only:
                print(name, flush=True)
                results[name] = asyncio.run(
                    resurge_recoveries(args.kills, fork_server, root / key, fault, level)
                )
        if not args.skip_baselines and only & {"c", "d"}:
            sys.path.insert(0, str(Path(__file__).parent))
            from recovery_baselines import cold_start_recoveries, torchrun_recoveries

            if "c" in only:
                print("(c) torchrun --max-restarts", flush=True)
                seconds, note = torchrun_recoveries(args.kills, root / "c")
                results["(c) torchrun --max-restarts"] = seconds
                notes.append(f"torchrun: {note}")
            if "d" in only:
                print("(d) full restart (cold workers)", flush=True)
                results["(d) full restart, cold workers"] = cold_start_recoveries(
                    args.kills, root / "d"
                )
    baseline = statistics.median(results.get("(a) resurge, fork server") or [0.0]) or None
    print()
    print(f"{'fault -> first step of the next generation':<44} {'median s':>10} {'min s':>8} "
          f"{'max s':>8} {'n':>3} {'vs (a)':>10}")  # fmt: skip
    for name, values in results.items():
        print(line(name, values, baseline))
    in_process = results.get("(e) resurge, in-process (exception)")
    process = results.get("(f) resurge, fork server (exception)")
    if in_process and process:
        speedup = statistics.median(process) / statistics.median(in_process)
        print(f"in-process restart is {speedup:.1f}x faster than the fork-server process "
              "restart after the same exception ((f) / (e))")  # fmt: skip
    stopped = results.get("(h) SIGSTOP, 3 s log rule, from the stop")
    if stopped:
        over = statistics.median(stopped) - HANG_RULE_SECONDS
        print(f"SIGSTOP -> next generation's first step: the rule's {HANG_RULE_SECONDS:g} s "
              f"+ {over:.2f} s (goal: + at most 1.5 s; max {max(stopped):.2f} s)")  # fmt: skip
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
