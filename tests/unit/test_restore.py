"""A local cluster starting again puts unfinished jobs back to Pending (pure part)."""

from datetime import UTC, datetime

from resurge.control.state.records import CheckpointRef, JobRecord, PendingRecovery, Placement
from resurge.events import JobPhase, RecoveryLevel
from resurge.local import job_factory
from resurge.local.restore import requeue_after_restart

JOB_TIME = datetime(2026, 12, 3, tzinfo=UTC)
JOB = job_factory.job("j", nproc=2, replicas=2, preload=None)


def running(**fields: object) -> JobRecord:
    return JobRecord(
        name="j", spec=JOB, phase=JobPhase.RUNNING, generation=3,
        placements=[Placement(replica=0, node="node-0"), Placement(replica=1, node="node-1")],
        spare_nodes=["node-2"], incarnations={0: 2}, **fields,
    )  # fmt: skip


def test_a_running_job_goes_back_to_pending_to_resume_from_its_checkpoint() -> None:
    record = running(latest_checkpoint=CheckpointRef(step=40, path="/c/40"))
    assert requeue_after_restart(record)
    assert record.phase is JobPhase.PENDING and record.generation == 4
    assert record.placements == [] and record.spare_nodes == []
    assert record.incarnations == {0: 3, 1: 1}  # new agents, new command consumers
    assert record.latest_checkpoint == CheckpointRef(step=40, path="/c/40")
    assert "resume from checkpoint step 40" in record.message


def test_a_plan_in_flight_is_dropped_and_finished_jobs_stay() -> None:
    plan = PendingRecovery(fault_id="f", level=RecoveryLevel.PROCESS, detected_at=JOB_TIME,
                           to_generation=3, start_at=JOB_TIME)  # fmt: skip
    record = running(pending_recovery=plan)
    record.phase = JobPhase.RECOVERING
    assert requeue_after_restart(record) and record.pending_recovery is None
    assert "resume from the start" in record.message
    done = running()
    done.phase = JobPhase.SUCCEEDED
    assert not requeue_after_restart(done) and done.phase is JobPhase.SUCCEEDED
