"""Recovery time after a worker fails: resurge against the ways to restart without it.

Every contestant runs the same job: the DDP example (examples/ddp/train.py, gloo on
CPU) on 2 nodes x 2 workers (4 ranks), a DCP checkpoint every 5 steps, 0.02 s of sleep
per step, the same flags. Each is broken several times, rank 1, 2, 3, 1, ... (global
ranks), each time once the current generation trained 12 steps, and each recovery is
timed from the same instant, the break, to the first completed step of the next
generation:

  (a) resurge, workers forked from the pre-warmed fork server (the default);
  (b) resurge with spec.forkServer false: every worker a new interpreter;
  (c) torchrun --max-restarts on the same script, 2 agents x 2 workers, c10d rendezvous
      (bench/recovery_baselines.py);
  (d) a full restart: the 3 survivors SIGKILLed at once and 4 workers relaunched cold
      from the newest checkpoint, with no detection, grace or rendezvous: the floor of
      any restart that recreates every worker, as pods (bench/recovery_baselines.py);
  (e) resurge in-process restart: an exception raised in a worker's training function
      (``resurge inject exception``), recovery.levels [in_process]: no process exits;
  (f) the same exception with recovery.levels [process]: a fork-server process restart;
  (g) resurge with the job's default recovery policy (every level, default backoff):
      independent kills of rotating ranks, each after the job trained again, as a long
      job meets them; each must stay a process restart with no backoff, as fast as (a);
  (h) a SIGSTOPped worker under a log rule that expects a step line every 3 s, default
      policy; the goal is the rule's 3 s plus at most 1.5 s (a stopped worker is killed at
      once, not after a grace);
  (i) a plain script (the same example where ``import resurge`` fails: no progress
      reports, it resumes from its newest checkpoint as under torchrun) with the job's
      default recovery policy: three independent kills (ranks 1, 2, 3), each 3 s after
      the job trained again; each kill's recovery level and time;
  (j) torchrun --max-restarts on that plain script, three kills (ranks 1, 2, 3), each 3 s
      after the job trained again;
  (k) the plain script loading its samples through ``DataLoader(num_workers=2)`` (its
      ranks have children that share their output pipes), process level, no backoff;
  (l) torchrun --max-restarts on the same script with the same DataLoader.

The instant each starts from. (a), (b), (d), (g), (i) to (l): just after this process
SIGKILLed the worker (``os.kill`` on the pid that the worker's agent reported in its
ProcessStarted event, or that ``/proc`` shows with that ``RANK`` under torchrun or the
relaunching loop). (h): just after this process SIGSTOPped it the same way. (e) and (f):
just before this process sent the injection command (``resurge inject exception``: only
the worker's agent can make its training function raise), so the command's way to the
agent and the worker counts against resurge. Where each ends: the first Progress event
of the next generation for (a), (b), (e) to (h) (what the worker reports after a
completed step); the first ``step N loss`` line of the next generation for a plain
script, which reports nothing else ((i), (k): the agent's LogLine event; (c), (d), (j),
(l): the line's arrival through a pipe). Each resurge variant but (g), (h) and (i)
allows one recovery level and no backoff, so every recovery is at that level and the
mechanism is measured, not the ladder's escalation or crash-loop delays. resurge's
variants restore the example's state from the nodes' memory (snapshotted every step)
where they can; the baselines load the newest disk checkpoint, as a script under
torchrun does.

A torchrun recovery that reaches no step within 120 s ends that contestant's run (its
note says what happened, with the error lines): its median is over the recoveries that
worked, which favours torchrun. Prints the medians (and 90th percentiles) and each
median as a ratio to (a), measured in the same run, and each plain-script variant's
against torchrun on the same script ((i) / (j), (k) / (l)); ``--values`` also prints
every recovery time.

    .venv/bin/python bench/recovery.py [--kills 5] [--skip-baselines] [--only a,g,h] [--values]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from published import Figure
from published import record as record_figures

from resurge.control.effects.client import inject_fault
from resurge.events import (
    Event,
    FaultDetected,
    LogLine,
    ProcessStarted,
    Progress,
    RecoveryLevel,
    RecoveryStarted,
)
from resurge.jobspec import BackoffSpec, LogRule, TrainingJob
from resurge.local.job_factory import ddp_example_job
from resurge.local.story import Observed, StoryResult, Watch, run_job
from resurge.runtime.bus import Bus

STEPS_BEFORE_KILL = 12
BREAK_SIGNALS = {"crash": signal.SIGKILL, "hang": signal.SIGSTOP}
# The example as a plain script: `import resurge` fails (a None entry in sys.modules), and
# without RESURGE_GENERATION it resumes from the newest checkpoint in its folder, as it
# does under torchrun.
PLAIN = (
    "import os, runpy, sys; sys.modules['resurge'] = None; "
    "os.environ.pop('RESURGE_GENERATION', None); sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
STEP_LINE = re.compile(r"^step (\d+) loss ")
INDEPENDENT_KILLS = 3
TRAINED_AGAIN_SECONDS = 3.0
DATA_WORKERS = 2

HANG_RULE_SECONDS = 3.0
TORCHRUN = "(c) torchrun --max-restarts, 2 x 2"
FULL_RESTART = "(d) full restart, cold workers"
PLAIN_KILLS = "(i) plain script, default policy, 3 kills"
TORCHRUN_PLAIN = "(j) torchrun, plain script, 3 kills"
PLAIN_LOADER = "(k) plain script, DataLoader(num_workers=2)"
TORCHRUN_LOADER = "(l) torchrun, DataLoader(num_workers=2)"


def bench_job(
    kills: int,
    fork_server: bool,
    checkpoints: Path,
    level: RecoveryLevel | None = RecoveryLevel.PROCESS,
    hang_rule: bool = False,
    plain: bool = False,
    data_workers: int = 0,
) -> TrainingJob:
    """The DDP example; ``level`` None keeps the job's default recovery policy; ``plain``
    runs it as a plain script (:data:`PLAIN`) that prints every step."""
    example = ddp_example_job(checkpoints).spec
    # A plain job must outlast its kills and the training before each; the story ends
    # with its last recovery.
    steps = 100_000 if plain else 20 + kills * (STEPS_BEFORE_KILL + 10) + 10
    program = ["python", "-c", PLAIN] if plain else ["python"]
    command = [
        *program, "examples/ddp/train.py", "--steps", str(steps), "--checkpoint-every", "5",
        "--step-seconds", "0.02", "--data-workers", str(data_workers),
    ]  # fmt: skip
    if plain:
        command += ["--log-every", "1"]
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


def pid_of(seen: list[Observed], generation: int, rank: int) -> int:
    """The pid of global ``rank`` in ``generation``, as its agent reported it started."""
    started = [
        o.event.pid
        for o in seen
        if isinstance(o.event, ProcessStarted)
        and o.event.generation == generation
        and o.event.rank == rank
    ]
    if not started:
        raise LookupError(f"no process of rank {rank} in generation {generation} was seen")
    return started[-1]


async def break_worker(
    bus: Bus, watch: Watch, job: str, generation: int, rank: int, fault: str
) -> datetime:
    """Break ``rank`` of ``generation``: SIGKILL (crash), SIGSTOP (hang) or an injected
    exception; the instant it broke (for an exception, when the command was sent)."""
    if fault == "exception":
        sent = datetime.now(UTC)
        await inject_fault(bus, job, rank, fault)
        return sent
    os.kill(pid_of(watch.observed, generation, rank), BREAK_SIGNALS[fault])
    return datetime.now(UTC)


async def break_repeatedly(
    bus: Bus, watch: Watch, job: str, kills: int, fault: str, broken_at: list[datetime]
) -> None:
    for generation in range(kills):

        def ready(seen: list[Observed], generation: int = generation) -> bool:
            steps = [
                o.event.step
                for o in seen
                if isinstance(o.event, Progress) and o.event.generation == generation
            ]
            return len(set(steps)) >= STEPS_BEFORE_KILL

        await watch.wait_for(ready, wait_seconds=120)
        rank = 1 + generation % 3
        broken_at.append(await break_worker(bus, watch, job, generation, rank, fault))


def latencies_after(result: StoryResult, broken_at: list[datetime]) -> list[float]:
    """Seconds from each break (generation g) to the first Progress of generation g + 1."""
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
    return latencies_after(result, broken_at)


@dataclass
class StepLines:
    """The job's ``step N loss`` lines by generation, as they arrive (a plain script's
    only sign of training): {generation: [(time, step)]}."""

    seen: dict[int, list[tuple[datetime, int]]] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, event: Event, subject: str) -> None:
        if isinstance(event, LogLine) and event.generation is not None:
            match = STEP_LINE.match(event.line)
            if match:
                self.seen.setdefault(event.generation, []).append((event.time, int(match[1])))
                self.changed.set()

    async def wait_for(self, ready: Callable[[], bool], seconds: float = 120.0) -> None:
        async with asyncio.timeout(seconds):
            while not ready():
                self.changed.clear()
                await self.changed.wait()

    def newest(self) -> int:
        return max(self.seen, default=-1)

    def first_after(self, generation: int) -> datetime | None:
        """When the first generation after ``generation`` that trained printed its first step."""
        later = [g for g in self.seen if g > generation]
        return min(t for t, _ in self.seen[min(later)]) if later else None


@dataclass
class PlainKill:
    generation: int
    killed_at: datetime
    seconds: float | None = None
    level: str = "-"


async def kill_plain(
    bus: Bus, watch: Watch, job: str, lines: StepLines, kills: int, trained_seconds: float,
    record: list[PlainKill],
) -> None:  # fmt: skip
    """Kill rank 1, 2, 3, 1, ... of the newest generation once it trained
    ``trained_seconds`` (at least STEPS_BEFORE_KILL steps); return once the last kill's
    next generation printed a step."""
    await bus.subscribe(bus.subjects.raw(job, "log_line", None), lines)
    for kill in range(kills):

        def trained() -> bool:
            steps = lines.seen.get(lines.newest(), [])
            if len({step for _, step in steps}) < STEPS_BEFORE_KILL:
                return False
            return (datetime.now(UTC) - steps[0][0]).total_seconds() >= trained_seconds

        await lines.wait_for(trained)
        generation = lines.newest()
        killed_at = await break_worker(bus, watch, job, generation, 1 + kill % 3, "crash")
        record.append(PlainKill(generation, killed_at))
        await lines.wait_for(lambda: lines.first_after(record[-1].generation) is not None)


async def plain_recoveries(
    kills: int, workdir: Path, trained_seconds: float, data_workers: int = 0,
    level: RecoveryLevel | None = None,
) -> list[PlainKill]:  # fmt: skip
    job = bench_job(kills, True, workdir / "ckpt", level, plain=True, data_workers=data_workers)
    lines = StepLines()
    record: list[PlainKill] = []
    result = await run_job(
        job,
        state_dir=workdir,
        namespace="bench",
        nodes=2,
        gpus_per_node=2,
        wait_seconds=300,
        during=lambda bus, watch: kill_plain(
            bus, watch, job.name, lines, kills, trained_seconds, record
        ),
        end_with_during=True,
    )
    levels = {r.from_generation: str(r.level) for r in result.events(RecoveryStarted)}
    for kill in record:
        first = lines.first_after(kill.generation)
        kill.seconds = (first - kill.killed_at).total_seconds() if first else None
        kill.level = levels.get(kill.generation, "-")
    shown = ", ".join(f"{k.level} {k.seconds:.2f} s" for k in record if k.seconds is not None)
    print(f"  {len(record)} kills: {shown or 'none recovered'}", flush=True)
    return record


def p90(values: list[float]) -> float:
    """The 90th percentile (nearest rank): 9 in 10 recoveries took at most this long."""
    ordered = sorted(values)
    return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]


def line(name: str, values: list[float], baseline: float | None) -> str:
    if not values:
        return f"{name:<44} {'no recovery':>10}"
    med = statistics.median(values)
    ratio = f"{med / baseline:>9.1f}x" if baseline else f"{'':>10}"
    return (f"{name:<44} {med:>10.3f} {p90(values):>8.3f} {min(values):>8.3f} "
            f"{max(values):>8.3f} {len(values):>3} {ratio}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--skip-baselines", action="store_true")
    parser.add_argument("--values", action="store_true", help="also print every recovery time")
    parser.add_argument(
        "--only",
        default="a,b,c,d,e,f,g,h,i,j,k,l",
        help="comma-separated variants to run (default all)",
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
        plain_variants = [
            ("i", PLAIN_KILLS, INDEPENDENT_KILLS, TRAINED_AGAIN_SECONDS, 0, None),
            ("k", PLAIN_LOADER, args.kills, 0.0, DATA_WORKERS, RecoveryLevel.PROCESS),
        ]
        for key, name, kills, trained, data_workers, plain_level in plain_variants:
            if key in only:
                print(name, flush=True)
                record = asyncio.run(
                    plain_recoveries(kills, root / key, trained, data_workers, plain_level)
                )
                results[name] = [k.seconds for k in record if k.seconds is not None]
                if key == "i":
                    notes.append(
                        f"{PLAIN_KILLS}: "
                        + ", ".join(
                            f"{k.level} {k.seconds:.2f} s" if k.seconds is not None else "-"
                            for k in record
                        )
                    )
        if not args.skip_baselines and only & {"c", "d", "j", "l"}:
            sys.path.insert(0, str(Path(__file__).parent))
            from recovery_baselines import full_restart_recoveries, torchrun_recoveries

            program = ["--no-python", sys.executable, "-c", PLAIN]
            for key, name, kills, extra, trained in (
                ("j", TORCHRUN_PLAIN, INDEPENDENT_KILLS, [], TRAINED_AGAIN_SECONDS),
                ("l", TORCHRUN_LOADER, args.kills, ["--data-workers", str(DATA_WORKERS)], 0.0),
            ):
                if key in only:
                    print(name, flush=True)
                    seconds, note = torchrun_recoveries(
                        kills, root / key, program=program, extra_args=extra,
                        trained_seconds=trained,
                    )  # fmt: skip
                    results[name] = seconds
                    notes.append(f"{name}: {note}")

            if "c" in only:
                print(TORCHRUN, flush=True)
                seconds, note = torchrun_recoveries(args.kills, root / "c")
                results[TORCHRUN] = seconds
                notes.append(f"torchrun: {note}")
            if "d" in only:
                print(FULL_RESTART, flush=True)
                results[FULL_RESTART] = full_restart_recoveries(args.kills, root / "d")
    baseline = statistics.median(results.get("(a) resurge, fork server") or [0.0]) or None
    print()
    print(f"{'break -> first step of the next generation':<44} {'median s':>10} {'p90 s':>8} "
          f"{'min s':>8} {'max s':>8} {'n':>3} {'vs (a)':>10}")  # fmt: skip
    if args.values:
        for name, values in results.items():
            print(f"  {name}: {', '.join(f'{v:.3f}' for v in values)}")
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
        print(f"SIGSTOP -> next generation's first step: the rule's {HANG_RULE_SECONDS:g} s"
              f" {over:+.2f} s (goal: + at most 1.5 s; max {max(stopped):.2f} s)")  # fmt: skip
    for ours, theirs in ((PLAIN_KILLS, TORCHRUN_PLAIN), (PLAIN_LOADER, TORCHRUN_LOADER)):
        if results.get(ours) and results.get(theirs):
            ratio = statistics.median(results[theirs]) / statistics.median(results[ours])
            print(f"{ours}: {ratio:.1f}x faster than torchrun on the same script (median)")
    for note in notes:
        print(note)
    print(f"recorded in {record_figures('recovery', figures(results, baseline))}")
    return 0


def figures(results: dict[str, list[float]], baseline: float | None) -> dict[str, Figure]:
    """Each variant's median seconds (``a_median_s``, ...) and, beside (a), its ratio
    to (a) (``c_x_a``); a variant with no recovery records nothing."""
    made: dict[str, Figure] = {}
    for name, values in results.items():
        if not values:
            continue
        key = name[1]  # "(a) resurge, ..." -> "a"
        median = statistics.median(values)
        made[f"{key}_median_s"] = (round(median, 2), "s")
        if baseline and key != "a":
            made[f"{key}_x_a"] = (round(median / baseline, 1), "x")
    return made


if __name__ == "__main__":
    sys.exit(main())
