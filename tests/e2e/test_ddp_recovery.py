"""The main job: real DDP training on the local cluster survives a SIGKILLed worker.

Everything is real: nats-server, the services and virtual nodes as processes, torch
workers forked from the agents' fork servers, gloo on CPU, DCP checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from resurge.events import Assign, JobPhase, RecoveryFinished, RecoveryLevel
from resurge.local.demo import (
    KILL_AFTER_STEP,
    demo_job,
    final_step,
    kill_one_worker,
    steps_lost,
    total_steps,
)
from resurge.local.story import run_job

pytestmark = pytest.mark.e2e


async def test_killed_worker_resumes_from_last_checkpoint_and_job_finishes(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = demo_job(tmp_path)
    steps = total_steps(job)
    every = int(job.spec.command[job.spec.command.index("--checkpoint-every") + 1])
    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=2, wait_seconds=150,
        during=lambda bus, watch: kill_one_worker(bus, watch, job.name),
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == steps
    [fault] = result.faults
    assert fault.reason == "process_killed" and fault.evidence["signal"] == "SIGKILL"
    [recovery] = [o.event for o in result.observed if isinstance(o.event, RecoveryFinished)]
    assert recovery.level is RecoveryLevel.PROCESS and recovery.duration_seconds > 0
    resumed = {o.event.resume_step for o in result.observed
               if isinstance(o.event, Assign) and o.event.generation == 1}  # fmt: skip
    assert len(resumed) == 1
    [resume_step] = resumed
    assert resume_step is not None and resume_step % every == 0
    assert resume_step >= KILL_AFTER_STEP - every
    [lost] = steps_lost(result)
    assert 0 <= lost <= every
