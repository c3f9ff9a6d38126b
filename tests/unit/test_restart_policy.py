from datetime import UTC, datetime, timedelta

from resurge.events import FaultDetected, FaultScope, JobPhase, RecoveryLevel, Source
from resurge.jobspec import parse_job
from resurge.records import JobRecord, Placement
from resurge_restarter.policy import (
    Verdict,
    apply_checkpoint,
    apply_fault,
    apply_sign_of_life,
)

SOURCE = Source(service="detector", instance="here:1")


def record(max_restarts: int = 2) -> JobRecord:
    job = parse_job(
        {
            "metadata": {"name": "j"},
            "spec": {"command": ["x"], "recovery": {"jobMaxRetryCount": max_restarts}},
        }
    )
    return JobRecord(
        name="j", spec=job, phase=JobPhase.RUNNING, placements=[Placement(replica=0, node="n")]
    )


def fault(fault_id: str, generation: int) -> FaultDetected:
    return FaultDetected(
        source=SOURCE,
        job="j",
        generation=generation,
        fault_id=fault_id,
        scope=FaultScope.PROCESS,
        reason="process_crash",
    )


def test_fault_starts_next_generation_at_process_level() -> None:
    rec = record()
    decision = apply_fault(rec, fault("a", 0))
    assert decision.verdict is Verdict.RESTART and decision.level is RecoveryLevel.PROCESS
    assert rec.generation == 1 and rec.phase is JobPhase.RECOVERING
    assert rec.restarts == {RecoveryLevel.PROCESS: 1}
    assert rec.pending_recovery is not None and rec.pending_recovery.to_generation == 1


def test_repeat_and_stale_faults_change_nothing() -> None:
    rec = record()
    apply_fault(rec, fault("a", 0))
    snapshot = rec.model_copy(deep=True)
    assert apply_fault(rec, fault("a", 0)).verdict is Verdict.IGNORE
    assert apply_fault(rec, fault("b", 0)).verdict is Verdict.IGNORE  # peer of the same crash
    assert rec == snapshot


def test_limit_spent_fails_the_job_naming_fault_and_limit() -> None:
    rec = record(max_restarts=1)
    apply_fault(rec, fault("a", 0))
    decision = apply_fault(rec, fault("b", 1))
    assert decision.verdict is Verdict.FAIL
    assert rec.phase is JobPhase.FAILED
    assert "jobMaxRetryCount=1" in rec.message and "b" in rec.message
    assert apply_fault(rec, fault("c", 1)).verdict is Verdict.IGNORE


def test_first_worker_start_closes_recovery_when_workers_report_no_progress() -> None:
    rec = record()
    bad = fault("a", 0)
    apply_fault(rec, bad)
    assert not apply_sign_of_life(rec, 0, datetime.now(UTC), progress=False)
    assert apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.25), progress=False)
    assert rec.phase is JobPhase.RUNNING and rec.pending_recovery is None
    assert rec.last_recovery_seconds == 0.25
    assert not apply_sign_of_life(rec, 1, bad.time, progress=False)


def test_first_step_closes_recovery_when_workers_report_progress() -> None:
    rec = record()
    assert apply_sign_of_life(rec, 0, datetime.now(UTC), progress=True)  # learns it reports
    assert rec.reports_progress
    bad = fault("a", 0)
    apply_fault(rec, bad)
    assert not apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.1), progress=False)
    assert rec.pending_recovery is not None
    assert apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.5), progress=True)
    assert rec.pending_recovery is None and rec.last_recovery_seconds == 0.5


def test_checkpoint_becomes_resume_point_once_every_rank_saved_it() -> None:
    rec = record()
    rec.placements = [Placement(replica=0, node="a"), Placement(replica=1, node="b")]
    assert rec.world_size == 2
    assert apply_checkpoint(rec, 0, 10, "/c/step-10")
    assert not apply_checkpoint(rec, 0, 10, "/c/step-10")  # a repeat changes nothing
    assert rec.latest_checkpoint is None
    assert apply_checkpoint(rec, 0, 20, "/c/step-20")
    assert apply_checkpoint(rec, 1, 10, "/c/step-10")
    assert rec.latest_checkpoint is not None and rec.latest_checkpoint.step == 10
    assert rec.checkpoint_reports == {20: [0]}
    assert not apply_checkpoint(rec, 1, 5, "/c/step-5")  # older than the resume point
    assert apply_checkpoint(rec, 1, 20, "/c/step-20")
    assert rec.latest_checkpoint.step == 20 and rec.checkpoint_reports == {}


def test_alerts_are_not_acted_on() -> None:
    rec = record()
    alert = fault("a", 0).model_copy(update={"alert_only": True})
    assert apply_fault(rec, alert).verdict is Verdict.IGNORE
    assert rec.generation == 0 and rec.handled_faults == []
