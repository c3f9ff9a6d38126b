"""A long job meets independent faults: each gets the cheapest rung, none adds up.

The DDP example (examples/ddp, 2 replicas x 2 gloo workers) on a real local cluster;
three different ranks are SIGKILLed one after another, each once the job trained
again past the checkpoint it resumed from. Before issue 9 the second climbed to
`pod`, the third to `job`, and a fourth would have failed the job.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from resurge.control.effects.client import inject_fault
from resurge.events import JobPhase, Progress, RecoveryFinished, RecoveryLevel
from resurge.local.demo import demo_job, final_step
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus

pytestmark = pytest.mark.e2e

KILLED_RANKS = (1, 2, 3)
STEPS = 150
EVERY = 10


def past_resume(generation: int, steps_past: int = 12) -> Callable[[list[Observed]], bool]:
    """The job's generation trained ``steps_past`` steps past where it resumed."""

    def test(seen: list[Observed]) -> bool:
        steps = [o.event.step for o in seen
                 if isinstance(o.event, Progress) and o.event.generation == generation]  # fmt: skip
        return len(steps) > 0 and max(steps) - min(steps) >= steps_past

    return test


async def test_three_sigkills_of_three_ranks_are_each_a_process_restart(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = demo_job(tmp_path)
    command = list(job.spec.command)
    command[command.index("--steps") + 1] = str(STEPS)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"command": command})})
    assert job.spec.recovery.max_restarts is None  # the example sets no lifetime cap

    async def kill_three(bus: Bus, watch: Watch) -> None:
        for generation, rank in enumerate(KILLED_RANKS):
            await watch.wait_for(past_resume(generation), wait_seconds=90)
            await inject_fault(bus, job.name, rank, "crash")

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=2, wait_seconds=240, during=kill_three,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == STEPS
    culprits = [f for f in result.faults if f.reason == "process_killed"]
    assert [(f.generation, f.rank) for f in culprits] == list(enumerate(KILLED_RANKS))
    recoveries = [e for e in result.events(RecoveryFinished) if isinstance(e, RecoveryFinished)]
    assert [r.level for r in recoveries] == [RecoveryLevel.PROCESS] * 3
    assert [r.generation for r in recoveries] == [1, 2, 3]
    print("recoveries (fault detected -> first step of the new generation):",
          ", ".join(f"{r.duration_seconds:.2f} s" for r in recoveries))  # fmt: skip
