"""A predicted failure moves a job off its node before it fails: real torch (gloo) on the
local cluster. The DDP example (2 replicas x 1 worker, its state protected in its nodes'
memory with ``run.protect``) trains; the simulated GPU under replica 1 starts showing a
rising corrected-ECC count. The gpu_warnings detector reports the warning sign, the
restarter's node ledger counts it against the node, asks the job for a checkpoint, and
moves replica 1 to the spare node; the moved rank takes the step from its peer's memory,
so at most the step in flight is trained again."""

from __future__ import annotations

from pathlib import Path

import pytest

from resurge.control.effects.client import inject_gpu_warning
from resurge.events import CheckpointSaved, JobPhase, RecoveryLevel, RecoveryStarted
from resurge.jobspec import TrainingJob
from resurge.local.demo import final_step, steps_lost, total_steps
from resurge.local.story import Watch, run_job
from resurge.runtime.bus import Bus
from tests.e2e.test_checkpointless import demo_job, mid_interval, origins, replica_node

pytestmark = pytest.mark.e2e
STEPS = 400  # at 0.05 s a step: long enough for the GPU's next samples to show the sign


def long_job(state_dir: Path) -> TrainingJob:
    """The example job (:func:`demo_job`) trained for :data:`STEPS` steps."""
    job = demo_job(state_dir)
    command = list(job.spec.command)
    command[command.index("--steps") + 1] = str(STEPS)
    return job.model_copy(update={"spec": job.spec.model_copy(update={"command": command})})


async def test_a_rising_ecc_count_moves_the_job_off_its_node_with_no_step_lost(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    warned: dict[str, str] = {}

    async def degrade(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(mid_interval, wait_seconds=120)
        warned["node"] = replica_node(watch.observed, 1)
        await inject_gpu_warning(bus, warned["node"], 0, "corrected-ecc")

    result = await run_job(
        long_job(tmp_path), state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
        nodes=3, gpus_per_node=1, wait_seconds=240, during=degrade,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == total_steps(long_job(tmp_path)) == STEPS
    [moved] = [e for e in result.events(RecoveryStarted) if e.reason == "node_warning"]
    assert moved.level is RecoveryLevel.NODE
    # It was asked for a checkpoint first, and saved one, before the move.
    saved_before = [e for e in result.events(CheckpointSaved) if e.time < moved.time]
    assert saved_before, "no checkpoint was saved before the move"
    assert all(e.reason != "node_warning" for e in result.events(RecoveryStarted) if e is not moved)
    [lost] = steps_lost(result)
    assert lost <= 1, f"{lost} step(s) trained again"
    assert origins(result, moved.to_generation) == {0: "memory", 1: "peer"}
    assert (
        replica_node(
            [
                o
                for o in result.observed
                if getattr(o.event, "generation", None) == moved.to_generation
            ],
            1,
        )
        != warned["node"]
    )
