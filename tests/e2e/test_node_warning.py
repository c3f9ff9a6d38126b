"""A predicted failure moves a job off its node before it fails, with no step trained
twice: real torch (gloo) on the local cluster. The DDP example (2 replicas x 1 worker)
trains; the simulated GPU under replica 1 starts showing a rising corrected-ECC count.
The gpu_warnings detector reports the warning sign, the restarter's node ledger counts
it against the node, asks the job for a checkpoint (its workers to hold after saving it),
and moves replica 1 to the spare node once every rank saved it.

- State protected in the nodes' memory (``run.protect``): the moved rank takes the step
  from its peer's memory.
- State on the disk only (``--no-protect``), steps of a few milliseconds (the move's
  stop takes tens: without the hold a few steps would be trained after the checkpoint,
  and again after the move): the job resumes from the checkpoint it was asked for, at
  the step after the last one trained.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from resurge.control.effects.client import inject_gpu_warning
from resurge.events import (
    Assign,
    CheckpointSaved,
    JobPhase,
    Progress,
    RecoveryLevel,
    RecoveryStarted,
    StateRestored,
)
from resurge.jobspec import TrainingJob
from resurge.local.demo import final_step, steps_lost, total_steps
from resurge.local.story import StoryResult, Watch, run_job
from resurge.runtime.bus import Bus
from tests.e2e.test_checkpointless import demo_job, mid_interval, origins, replica_node

pytestmark = pytest.mark.e2e
STEPS = 400  # at 0.05 s a step: long enough for the GPU's next samples to show the sign


def long_job(
    state_dir: Path, *flags: str, steps: int = STEPS, step_seconds: float = 0.05
) -> TrainingJob:
    """The example job (:func:`demo_job`) trained for ``steps`` steps of at least
    ``step_seconds``, with ``flags``."""
    job = demo_job(state_dir)
    command = list(job.spec.command)
    command[command.index("--steps") + 1] = str(steps)
    command[command.index("--step-seconds") + 1] = str(step_seconds)
    command += flags
    return job.model_copy(update={"spec": job.spec.model_copy(update={"command": command})})


def worker_lines(state_dir: Path, words: str) -> list[str]:
    """The lines of the agents' logs (the workers' output) that contain ``words``."""
    return [
        line
        for log in sorted((state_dir / "logs").glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if words in line
    ]


async def warned_and_moved(
    job: TrainingJob, state_dir: Path, nats_url: str, namespace: str
) -> tuple[StoryResult, RecoveryStarted, int]:
    """``job`` run to its end while the GPU under replica 1 shows a rising corrected-ECC
    count from the middle of its second checkpoint interval; the result, the move and
    the last step trained before it, checked: the job finished, moved once for the
    warning (a node recovery, after a checkpoint of that last step, its workers held
    after saving it), replica 1 off the warned node, and no step was trained twice."""
    warned: dict[str, str] = {}

    async def degrade(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(mid_interval, wait_seconds=120)
        warned["node"] = replica_node(watch.observed, 1)
        await inject_gpu_warning(bus, warned["node"], 0, "corrected-ecc")

    result = await run_job(
        job, state_dir=state_dir, nats_url=nats_url, namespace=namespace,
        nodes=3, gpus_per_node=1, wait_seconds=240, during=degrade,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == total_steps(job)
    [moved] = [e for e in result.events(RecoveryStarted) if e.reason == "node_warning"]
    assert moved.level is RecoveryLevel.NODE
    assert all(e.reason != "node_warning" for e in result.events(RecoveryStarted) if e is not moved)
    generation = moved.to_generation
    assert generation is not None
    last_trained = max(
        o.event.step
        for o in result.observed
        if isinstance(o.event, Progress)
        and o.event.generation is not None
        and o.event.generation < generation
    )
    # Every rank (a world of 2) saved that step before the move: the checkpoint asked for.
    saved = [e for e in result.events(CheckpointSaved) if e.time < moved.time]
    assert {(e.replica, e.local_rank) for e in saved if e.step == last_trained} == {(0, 0), (1, 0)}
    # A worker held after saving it (its peer held too, or waited on it in the next
    # step's collective), until the move stopped it.
    assert worker_lines(state_dir, f"holding after the checkpoint of step {last_trained} ")
    assert not worker_lines(state_dir, "training on after step")
    assert steps_lost(result) == [0], f"steps trained again: {steps_lost(result)}"
    first = min(
        o.event.step
        for o in result.observed
        if isinstance(o.event, Progress) and o.event.generation == generation
    )
    assert first == last_trained + 1
    assert (
        replica_node(
            [o for o in result.observed if getattr(o.event, "generation", None) == generation],
            1,
        )
        != warned["node"]
    )
    return result, moved, last_trained


async def test_a_rising_ecc_count_moves_the_job_off_its_node_with_no_step_lost(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    result, moved, _ = await warned_and_moved(long_job(tmp_path), tmp_path, nats_url, namespace)
    assert origins(result, moved.to_generation) == {0: "memory", 1: "peer"}


async def test_a_job_that_resumes_from_the_disk_is_moved_with_no_step_redone(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    # 2,000 steps of about 20 ms: the sign shows within a few hundred.
    job = long_job(tmp_path, "--no-protect", steps=2000, step_seconds=0.005)
    result, moved, last_trained = await warned_and_moved(job, tmp_path, nats_url, namespace)
    assert not result.events(StateRestored)  # nothing live: the disk it is
    assigned = {e.resume_step for e in result.events(Assign) if e.generation == moved.to_generation}
    assert assigned == {last_trained}, "not resumed from the checkpoint of its last step"
