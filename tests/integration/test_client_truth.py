"""What the CLI's bus client says about jobs that exist, have finished or do not exist.

A real nats-server; the job records are written directly, as the scaler would.
"""

from __future__ import annotations

import pytest

from resurge.control.decisions.admission import new_record
from resurge.control.effects.client import SubmitRefused, delete_job, inject_fault, submit_job
from resurge.control.state.records import JobStore, Placement
from resurge.events import JobPhase
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus


async def _stored(bus: Bus, spec: TrainingJob, phase: JobPhase) -> None:
    record = new_record(spec, None)
    record.phase = phase
    assert await JobStore(await bus.jobs_bucket()).create(record)


async def _submissions(bus: Bus) -> int:
    info = await bus.js.stream_info(bus.subjects.stream("job"))
    return int(info.state.messages)


async def test_a_new_job_is_created(bus: Bus) -> None:
    assert await submit_job(bus, job("fresh")) == "created"
    assert await _submissions(bus) == 1


async def test_the_same_spec_again_is_unchanged_and_sends_nothing(bus: Bus) -> None:
    await _stored(bus, job("same", nproc=2), JobPhase.RUNNING)
    assert await submit_job(bus, job("same", nproc=2)) == "unchanged"
    assert await _submissions(bus) == 0


async def test_new_monitoring_settings_configure_a_running_job(bus: Bus) -> None:
    await _stored(bus, job("live"), JobPhase.RUNNING)
    changed = job("live", monitoring={"heartbeatTimeoutSeconds": 30})
    assert await submit_job(bus, changed) == "configured"
    assert await _submissions(bus) == 1


async def test_a_running_job_refuses_a_change_it_cannot_take(bus: Bus) -> None:
    await _stored(bus, job("live", nproc=1), JobPhase.RUNNING)
    with pytest.raises(
        SubmitRefused,
        match=r"only spec.monitoring and spec.replicas.max .* "
        r"changes spec.nprocPerNode; `resurge delete",
    ):
        await submit_job(bus, job("live", nproc=2))
    with pytest.raises(SubmitRefused, match=r"this changes spec.replicas.min; `resurge delete"):
        await submit_job(bus, job("live", nproc=1, replicas={"min": 2, "max": 2}))
    assert await _submissions(bus) == 0


async def test_a_new_replicas_max_configures_a_running_job(bus: Bus) -> None:
    await _stored(bus, job("elastic", replicas={"min": 1, "max": 2}), JobPhase.RUNNING)
    changed = job("elastic", replicas={"min": 1, "max": 4})
    assert await submit_job(bus, changed) == "configured"
    assert await _submissions(bus) == 1


async def test_a_finished_job_is_not_rerun_over_its_checkpoints(bus: Bus) -> None:
    await _stored(bus, job("done"), JobPhase.SUCCEEDED)
    with pytest.raises(SubmitRefused, match=r"has Succeeded; `resurge delete done` first"):
        await submit_job(bus, job("done"))
    assert await _submissions(bus) == 0


async def test_deleting_an_unknown_job_is_an_error(bus: Bus) -> None:
    with pytest.raises(LookupError, match="no job named 'ghost'"):
        await delete_job(bus, "ghost")
    assert await _submissions(bus) == 0


async def test_injecting_into_a_finished_job_is_an_error(bus: Bus) -> None:
    await _stored(bus, job("over"), JobPhase.FAILED)
    with pytest.raises(LookupError, match="has Failed: no worker is running"):
        await inject_fault(bus, "over", 0, "crash")


async def test_an_injected_fault_goes_to_the_replica_that_runs_the_rank_after_a_shrink(
    bus: Bus,
) -> None:
    # Replica 0 was removed by a shrink: ranks 0-1 now run on replica 1, 2-3 on replica 3
    # (planner.assignments numbers them by the placements in replica order). Before, rank
    # 2 went to replica 1 (2 // nproc), where no agent runs it.
    record = new_record(job("shrunk", nproc=2, replicas={"min": 1, "max": 4}), None)
    record.phase = JobPhase.RUNNING
    record.placements = [Placement(replica=3, node="n3"), Placement(replica=1, node="n1")]
    assert await JobStore(await bus.jobs_bucket()).create(record)
    sent = await bus.nc.subscribe(bus.subjects.cmd("shrunk", 3))

    where = await inject_fault(bus, "shrunk", 2, "crash")

    assert where.startswith("replica 3, local rank 0,")
    message = await sent.next_msg(timeout=5)
    assert b'"rank":2' in message.data
