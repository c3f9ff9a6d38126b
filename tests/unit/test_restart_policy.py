from datetime import UTC, datetime, timedelta

from resurge.events import FaultDetected, FaultScope, JobPhase, RecoveryLevel, Source
from resurge.jobspec import parse_job
from resurge.records import JobRecord, Placement
from resurge_restarter.policy import Verdict, apply_fault, apply_sign_of_life

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


def test_sign_of_life_closes_recovery_with_its_duration() -> None:
    rec = record()
    bad = fault("a", 0)
    apply_fault(rec, bad)
    assert not apply_sign_of_life(rec, 0, datetime.now(UTC))
    assert apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.25))
    assert rec.phase is JobPhase.RUNNING and rec.pending_recovery is None
    assert rec.last_recovery_seconds == 0.25
    assert not apply_sign_of_life(rec, 1, bad.time)
