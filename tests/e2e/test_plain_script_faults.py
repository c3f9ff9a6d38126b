"""A plain DDP script meets independent faults: each is a process restart.

The scripts (tests/e2e/workers/plain_ddp.py, a torchrun-style script, and
plain_lightning.py, a PyTorch Lightning one) never import resurge and report no
progress; their only sign of life is their rendezvous, which the agent of rank 0's
replica hosts (RendezvousPassed). 2 nodes x 2 ranks; rank 1, then rank 2, then rank 3 are
SIGKILLed, each once the job trains again after the last recovery. Before the agent
hosted the store, a generation of such a script counted as "not fixed" for 30 s, and
the second kill climbed to `pod`, the third to `job`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from resurge.control.effects.client import inject_fault
from resurge.events import JobPhase, RecoveryFinished, RecoveryLevel, RendezvousPassed
from resurge.local.job_factory import python_job
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus

pytestmark = pytest.mark.e2e

WORKERS = Path(__file__).parent / "workers"
# Each script with what its fork server preloads.
SCRIPTS = {
    "torchrun": ("plain_ddp.py", ["torch"]),
    "lightning": ("plain_lightning.py", ["lightning"]),
}
KILLED_RANKS = (1, 2, 3)


def count(kind: type, seen: list[Observed]) -> int:
    return sum(isinstance(o.event, kind) for o in seen)


def recovered(times: int) -> Callable[[list[Observed]], bool]:
    """The job has finished ``times`` recoveries: it trains again."""
    return lambda seen: count(RecoveryFinished, seen) >= times


@pytest.mark.parametrize("flavour", sorted(SCRIPTS))
async def test_three_kills_of_a_plain_ddp_script_are_each_a_process_restart(
    flavour: str, nats_url: str, namespace: str, tmp_path: Path
) -> None:
    script, preload = SCRIPTS[flavour]
    job = python_job(
        f"plain-{flavour}", WORKERS / script, "--steps", "400", "--step-seconds", "0.05",
        nproc=2, replicas=2, preload=preload, env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip

    async def kill_three(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: count(RendezvousPassed, seen) >= 1, wait_seconds=120)
        for done, rank in enumerate(KILLED_RANKS):
            await watch.wait_for(recovered(done), wait_seconds=90)
            await inject_fault(bus, job.name, rank, "crash")

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=2, wait_seconds=300, during=kill_three, cwd=tmp_path,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    culprits = [f for f in result.faults if f.reason == "process_killed"]
    assert [(f.generation, f.rank) for f in culprits] == list(enumerate(KILLED_RANKS))
    recoveries = [e for e in result.events(RecoveryFinished) if isinstance(e, RecoveryFinished)]
    assert [r.level for r in recoveries] == [RecoveryLevel.PROCESS] * 3
    assert [r.generation for r in recoveries] == [1, 2, 3]
    passed = [e for e in result.events(RendezvousPassed) if isinstance(e, RendezvousPassed)]
    assert sorted(e.generation or 0 for e in passed) == [0, 1, 2, 3]
    assert {e.world_size for e in passed} == {4}
    print("recoveries (fault detected -> generation started):",
          ", ".join(f"{r.duration_seconds:.2f} s" for r in recoveries))  # fmt: skip
