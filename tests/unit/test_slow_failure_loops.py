"""Whether the last restart fixed a fault is a fact about generations, not time: failure
loops slower than ``evalPeriodSeconds`` climb the ladder and end, independent faults do not."""

from datetime import UTC, datetime, timedelta
from typing import Any

from resurge.control.decisions.recovery_policy import (
    Verdict,
    apply_fault,
    apply_rendezvous,
    apply_sign_of_life,
)
from resurge.control.state.records import JobRecord, Placement
from resurge.detection import DetectorContext
from resurge.events import (
    FaultDetected,
    FaultScope,
    JobPhase,
    ProcessStarted,
    Progress,
    RecoveryLevel,
    Source,
)
from resurge.local import job_factory
from resurge_detector.hang import HangDetector

SOURCE = Source(service="detector", instance="here:1")
T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
LADDER = list(RecoveryLevel)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job_record(**recovery: Any) -> JobRecord:
    job = job_factory.job("j", nproc=2, replicas=1, recovery=recovery or None, preload=None)
    return JobRecord(
        name="j", spec=job, phase=JobPhase.RUNNING, placements=[Placement(replica=0, node="n0")]
    )


def crash(rec: JobRecord, rank: int = 1, reason: str = "process_crash") -> FaultDetected:
    return FaultDetected(
        source=SOURCE,
        job="j",
        generation=rec.generation,
        rank=rank,
        replica=0,
        fault_id=f"{reason}:g{rec.generation}:r{rank}",
        scope=FaultScope.PROCESS,
        reason=reason,
        suggested_level=RecoveryLevel.PROCESS,
        time=T0,
    )


def started(rank: int, generation: int) -> ProcessStarted:
    return ProcessStarted(
        source=SOURCE, job="j", generation=generation, rank=rank, replica=0, node="n0",
        pid=100 + rank, local_rank=rank, local_world_size=2,
    )  # fmt: skip


def stepped(rank: int, generation: int, step: int) -> Progress:
    return Progress(
        source=SOURCE, job="j", generation=generation, rank=rank, replica=0, node="n0",
        local_rank=rank, step=step,
    )  # fmt: skip


def test_a_generation_that_hangs_in_start_up_climbs_and_ends_though_each_hang_takes_600_s() -> None:
    """The detector's learned start-up limit (at least 600 s) judges each hang of a new
    generation later than evalPeriodSeconds (600 s) after the restart that started it:
    each must still count as that restart not working."""
    rec = job_record()
    hang = HangDetector()

    def ctx(seconds: float) -> DetectorContext:
        return DetectorContext(now=at(seconds), source=SOURCE, jobs={"j": rec})

    for rank in (0, 1):  # generation 0 starts and trains: its start-up is learned
        hang.observe(started(rank, 0), ctx(0))
    for step in range(1, 6):
        for rank in (0, 1):
            hang.observe(stepped(rank, 0, step), ctx(step))
            apply_sign_of_life(rec, 0, at(step), progress=True, step=step)
    now = 10.0
    decisions = [apply_fault(rec, crash(rec), now=at(now), reached=5)]  # an independent crash
    while decisions[-1].verdict is Verdict.RESTART and len(decisions) < 12:
        generation = rec.generation
        for rank in (0, 1):  # the new generation starts and hangs before its first step
            hang.observe(started(rank, generation), ctx(now + 1))
            apply_sign_of_life(rec, generation, at(now + 1), progress=False)
        faults: list[FaultDetected] = []
        while not faults:
            now += 30
            faults = [f for f in hang.tick(ctx(now)) if isinstance(f, FaultDetected)]
        assert faults[0].generation == generation and faults[0].reason == "hang"
        spent = now - (rec.history[-1].time - T0).total_seconds()
        assert spent > rec.spec.spec.recovery.eval_period_seconds
        decisions.append(apply_fault(rec, faults[0], now=at(now)))
    levels = [d.level for d in decisions if d.verdict is Verdict.RESTART]
    assert decisions[-1].verdict is Verdict.FAIL, levels
    assert levels[:2] == [RecoveryLevel.PROCESS, RecoveryLevel.POD]
    assert levels == sorted(levels, key=LADDER.index) and levels[-1] is RecoveryLevel.JOB
    assert "made no step past the resume point" in rec.message
    assert rec.phase is JobPhase.FAILED


def test_generations_that_get_no_further_than_one_step_climb_and_fail_naming_it() -> None:
    """A crash at step 105 in every generation, an hour apart, resuming from step 100:
    each generation trains past its resume point but never past step 104."""
    rec = job_record()
    rec.latest_checkpoint = None
    levels = []
    for hour in range(12):
        resume = 0 if hour == 0 else 100
        for step in range(resume + 1, 105):
            when = at(3600 * hour + step)
            apply_sign_of_life(rec, rec.generation, when, progress=True, step=step)
        decision = apply_fault(rec, crash(rec), now=at(3600 * hour + 200), reached=104)
        if decision.verdict is Verdict.FAIL:
            break
        levels.append(decision.level)
        rec.resume_step = 100
    assert decision.verdict is Verdict.FAIL, levels
    assert levels[0] is RecoveryLevel.PROCESS and levels[-1] is RecoveryLevel.JOB
    assert levels == sorted(levels, key=LADDER.index)
    assert "got no further than step 104" in rec.message


def test_a_script_that_dies_before_its_rendezvous_every_time_ends_however_slowly() -> None:
    rec = job_record()
    apply_rendezvous(rec, 0, at(1))  # generation 0 trained; then every later one dies early
    levels = []
    for hour in range(12):
        decision = apply_fault(rec, crash(rec), now=at(3600 * (hour + 1)))
        if decision.verdict is Verdict.FAIL:
            break
        levels.append(decision.level)
        apply_sign_of_life(rec, rec.generation, at(3600 * (hour + 1) + 1), progress=False)
    assert decision.verdict is Verdict.FAIL, levels
    assert levels[:2] == [RecoveryLevel.PROCESS, RecoveryLevel.POD]
    assert levels[-1] is RecoveryLevel.JOB
    assert "ended before the rendezvous" in rec.message


def test_faults_of_generations_that_trained_further_stay_at_the_cheapest_rung() -> None:
    """A crash every hour on the same rank, each generation past the one before: every
    one a new incident however many."""
    rec = job_record()
    for hour in range(12):
        reached = 1000 * (hour + 1)
        apply_sign_of_life(rec, rec.generation, at(3600 * hour + 1), progress=True, step=reached)
        decision = apply_fault(rec, crash(rec), now=at(3600 * hour + 2), reached=reached)
        assert decision.verdict is Verdict.RESTART and decision.level is RecoveryLevel.PROCESS
        assert rec.pending_recovery is not None
        assert rec.pending_recovery.start_at == at(3600 * hour + 2)  # no backoff
    assert len(rec.history) == 1


def test_plain_script_generations_that_passed_their_rendezvous_are_independent() -> None:
    rec = job_record()
    for hour in range(12):
        apply_rendezvous(rec, rec.generation, at(3600 * hour + 1))
        decision = apply_fault(rec, crash(rec, rank=hour % 2), now=at(3600 * hour + 2))
        assert decision.level is RecoveryLevel.PROCESS, decision.why


def test_other_faults_of_a_job_without_checkpoints_stay_cheap_though_none_got_further() -> None:
    """Every generation trains from step 0 again; each fault is another kind or rank, so
    none of them says the restart before failed, whatever step it came at."""
    rec = job_record()
    faults = [("process_crash", 1, 500), ("hang", 0, 300), ("process_killed", 1, 200)]
    for hour, (reason, rank, reached) in enumerate(faults):
        apply_sign_of_life(rec, rec.generation, at(3600 * hour + 1), progress=True, step=1)
        culprit = crash(rec, rank=rank, reason=reason)
        decision = apply_fault(rec, culprit, now=at(3600 * hour + 2), reached=reached)
        assert decision.level is RecoveryLevel.PROCESS, decision.why
