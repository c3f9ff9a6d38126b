"""``resurge demo``: the whole story in one command.

Starts a local cluster (embedded NATS, the services, 2 virtual nodes with 2 simulated
GPUs each), runs the DDP example of ``examples/ddp`` on it (2 replicas x 2 workers,
gloo on CPU), kills one worker mid-training, lets resurge recover the job from its
last checkpoint, and prints what was detected, what was restarted, how long each
recovery took and how many steps were lost; then stops everything. Exits 0 only if
the job succeeded, reaching its final step, after exactly one recovery. It runs in a
temporary state folder, removed if the demo passed, or in the one ``--state-dir``
names, which is kept (its logs, its NATS data); a folder where a local cluster runs
already is refused.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from resurge.control.effects.client import inject_fault
from resurge.control.views.event_words import event_line
from resurge.events import (
    AgentState,
    CheckpointSaved,
    JobPhase,
    Progress,
)
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import EXAMPLE, ddp_example_job
from resurge.local.story import Observed, StoryResult, Watch, run_job
from resurge.runtime.bus import Bus

__all__ = ["demo_job", "run_demo", "summarize"]

KILL_AFTER_STEP = 25
KILLED_RANK = 1


def demo_job(state_dir: Path) -> TrainingJob:
    """The DDP example, run from the checkout, checkpointing into ``state_dir``."""
    return ddp_example_job(state_dir / "ckpt")


def total_steps(job: TrainingJob) -> int:
    command = job.spec.command
    return int(command[command.index("--steps") + 1])


async def kill_one_worker(bus: Bus, watch: Watch, job: str) -> None:
    """Once the first generation passed a checkpoint, SIGKILL one worker through its agent."""

    def trained_past_a_checkpoint(seen: list[Observed]) -> bool:
        saved = [o.event.step for o in seen if isinstance(o.event, CheckpointSaved)]
        steps = [o.event.step for o in seen if isinstance(o.event, Progress)]
        return bool(saved) and max(steps, default=0) >= KILL_AFTER_STEP

    await watch.wait_for(trained_past_a_checkpoint, wait_seconds=120)
    where = await inject_fault(bus, job, KILLED_RANK, "crash")
    print(f"*** killing rank {KILLED_RANK} with SIGKILL ({where}) ***", flush=True)


def steps_lost(result: StoryResult) -> list[int]:
    """Per finished recovery: the steps trained again, the last step any generation before
    it reached less the step its generation went on after (its first step, less one),
    whether it resumed from peers' memory or from the disk."""
    lost = []
    for recovery in result.recoveries:
        if recovery.generation is None:
            continue
        reached = max(
            (step for g in range(recovery.generation) for step in _steps(result, g)), default=0
        )
        first = min(_steps(result, recovery.generation), default=None)
        if first is not None:
            # A step finished whose progress never went out (its rank stopped in the next
            # collective) makes this -1: nothing was trained again.
            lost.append(max(0, reached - (first - 1)))
    return lost


def _steps(result: StoryResult, generation: int) -> list[int]:
    return [
        o.event.step
        for o in result.observed
        if isinstance(o.event, Progress) and o.event.generation == generation
    ]


def final_step(result: StoryResult) -> int:
    return max((o.event.step for o in result.observed if isinstance(o.event, Progress)), default=0)


def summarize(result: StoryResult, steps: int) -> str:
    """What happened to the job, for people: faults, recoveries, steps lost, latencies."""
    lines = ["", "=== resurge demo summary ==="]
    phase = result.phase.value if result.phase else "did not finish"
    lines.append(
        f"job {result.job}: {phase} in {result.seconds:.1f} s, "
        f"final step {final_step(result)} of {steps}"
    )
    for fault in result.faults:
        lines.append(f"detected: {fault.reason} ({fault.message})")
    for recovery, lost in zip(result.recoveries, steps_lost(result), strict=False):
        lines.append(
            f"recovered: level {recovery.level.value} in {recovery.duration_seconds:.2f} s "
            f"(fault detected -> first step of the new generation), {lost} step(s) lost"
        )
    for latency in result.restart_latencies():
        lines.append(f"worker exit -> restart command: {latency * 1000:.1f} ms")
    return "\n".join(lines)


def shortfalls(result: StoryResult, steps: int) -> list[str]:
    """What the demo expected and did not see (nothing: it passed)."""
    found = []
    if result.phase is not JobPhase.SUCCEEDED:
        found.append(f"the job ended {result.phase.value if result.phase else 'unfinished'}")
    if len(result.recoveries) != 1:
        found.append(f"{len(result.recoveries)} recoveries, not 1")
    if final_step(result) != steps:
        found.append(f"final step {final_step(result)}, not {steps}")
    states = result.final_agent_states()
    for replica, state in sorted(states.items()):
        if state is not AgentState.EXITING:
            found.append(f"replica {replica}'s agent last said {state.value}, not exiting")
    return found


async def _demo(state_dir: Path) -> int:
    job = demo_job(state_dir)
    steps = total_steps(job)

    def show(item: Observed) -> None:
        event = item.event
        line = event_line(event, every=10)
        if line is not None:
            print(line, flush=True)

    print(f"starting a local cluster in {state_dir}: 2 nodes x 2 simulated GPUs", flush=True)
    result = await run_job(
        job,
        state_dir=state_dir,
        namespace="demo",
        nodes=2,
        gpus_per_node=2,
        wait_seconds=150,
        on_event=show,
        during=lambda bus, watch: kill_one_worker(bus, watch, job.name),
    )
    print(summarize(result, steps))
    missing = shortfalls(result, steps)
    for shortfall in missing:
        print(f"not as expected: {shortfall}")
    print(f"demo FAILED: see the logs in {state_dir / 'logs'}" if missing else "demo passed")
    return 1 if missing else 0


def run_demo(state_dir: Path | None = None) -> int:
    """Run the demo in ``state_dir`` (kept), or in a temporary state folder (kept if it
    fails); returns the exit status."""
    if not EXAMPLE.is_file():
        print(
            f"resurge demo needs the examples folder of a source checkout ({EXAMPLE.parent})",
            file=sys.stderr,
        )
        return 2
    folder = state_dir.resolve() if state_dir else Path(tempfile.mkdtemp(prefix="resurge-demo-"))
    try:
        code = asyncio.run(_demo(folder))
    except RuntimeError as error:  # a cluster runs there already, or did not start
        print(f"resurge demo: {error}", file=sys.stderr)
        return 2
    if code == 0 and state_dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    return code
