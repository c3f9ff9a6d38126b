"""The live goodput meter: its sums by cause, and that they agree with the report's
timeline (resurge.control.views.timeline) on the same story."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from resurge.contract.vocabulary import JobPhase
from resurge.control.views.goodput_meter import CAUSES, GoodputMeter
from resurge.control.views.timeline import build_timeline
from resurge.events import (
    Event,
    FaultDetected,
    FaultScope,
    PhaseChanged,
    ProcessExited,
    Progress,
    RecoveryFinished,
    RecoveryLevel,
    RecoveryStarted,
    Source,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
SOURCE = Source(service="test", instance="t")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_fresh_job_has_lost_nothing_and_full_goodput() -> None:
    meter = GoodputMeter()
    meter.phase("a", JobPhase.PENDING, T0, at(0))
    meter.phase("a", JobPhase.RUNNING, T0, at(2))
    sums = meter.jobs["a"]
    assert sums.lost(at(10)) == dict.fromkeys(CAUSES, 0.0)
    assert sums.goodput(at(10)) == 1.0
    assert sums.wall(at(10)) == 10.0


def test_pending_before_the_first_run_is_not_waiting_for_capacity_but_after_it_is() -> None:
    meter = GoodputMeter()
    meter.phase("a", JobPhase.PENDING, T0, at(0))
    meter.phase("a", JobPhase.RUNNING, T0, at(5))
    meter.phase("a", JobPhase.PENDING, T0, at(10))  # suspended
    assert meter.jobs["a"].lost(at(13))["waiting_for_capacity"] == 3.0  # still Pending
    meter.phase("a", JobPhase.RUNNING, T0, at(14))
    assert meter.jobs["a"].lost(at(30))["waiting_for_capacity"] == 4.0
    assert meter.jobs["a"].goodput(at(40)) == pytest.approx(36 / 40)


def test_detection_counts_each_fault_once_from_its_exit_and_only_for_exits() -> None:
    meter = GoodputMeter()
    meter.phase("a", JobPhase.RUNNING, T0, at(0))
    meter.fault("a", "exit:r1", at(10.5), exited=at(10))
    meter.fault("a", "exit:r1", at(10.5), exited=at(10))  # redelivered
    meter.fault("a", "hang:r0", at(20), exited=None)
    meter.fault("unknown", "exit:r0", at(10.5), exited=at(10))
    assert meter.jobs["a"].lost(at(30))["detection"] == 0.5
    assert "unknown" not in meter.jobs


def test_restarts_and_redone_steps_at_the_median_step_time() -> None:
    meter = GoodputMeter()
    meter.phase("a", JobPhase.RUNNING, T0, at(0))
    for step in range(1, 11):  # a step every second
        meter.step("a", step, at(step))
    meter.restarted("a", 2.0)
    for step in range(6, 13):  # resumed from step 5: steps 6..10 again
        meter.step("a", step, at(12 + step - 6))
    lost = meter.jobs["a"].lost(at(20))
    assert lost["restart"] == 2.0
    assert lost["redone_steps"] == pytest.approx(5.0)
    assert meter.jobs["a"].goodput(at(20)) == pytest.approx((20 - 7) / 20)


def test_a_finished_job_stops_its_clock_and_the_oldest_finished_ones_are_forgotten() -> None:
    meter = GoodputMeter(keep_finished=2)
    for name in ("a", "b", "c"):
        meter.phase(name, JobPhase.RUNNING, T0, at(0))
    meter.phase("a", JobPhase.SUCCEEDED, T0, at(10))
    assert meter.jobs["a"].wall(at(100)) == 10.0
    meter.phase("b", JobPhase.FAILED, T0, at(11))
    meter.phase("c", JobPhase.SUCCEEDED, T0, at(12))
    assert sorted(meter.jobs) == ["b", "c"]
    meter.forget("c")  # deleted
    assert sorted(meter.jobs) == ["b"]


def test_the_same_name_submitted_again_starts_over() -> None:
    meter = GoodputMeter()
    meter.phase("a", JobPhase.RUNNING, T0, at(0))
    meter.restarted("a", 3.0)
    meter.phase("a", JobPhase.SUCCEEDED, T0, at(5))
    meter.phase("a", JobPhase.PENDING, at(6), at(6))
    assert meter.jobs["a"].lost(at(10))["restart"] == 0.0
    assert meter.jobs["a"].wall(at(10)) == 4.0


def test_the_meter_agrees_with_the_report_timeline_on_one_story() -> None:
    job = "story"
    events: list[Event] = [
        PhaseChanged(source=SOURCE, job=job, phase=JobPhase.PENDING, time=at(0)),
        PhaseChanged(
            source=SOURCE, job=job, phase=JobPhase.RUNNING, previous=JobPhase.PENDING, time=at(1)
        ),
        *[
            Progress(
                source=SOURCE, job=job, rank=0, local_rank=0, generation=0, step=s, time=at(1 + s)
            )
            for s in range(1, 9)
        ],
        ProcessExited(
            source=SOURCE,
            job=job,
            rank=0,
            generation=0,
            pid=1,
            local_rank=0,
            local_world_size=1,
            exit_code=1,
            time=at(9.5),
        ),
        FaultDetected(
            source=SOURCE,
            job=job,
            rank=0,
            generation=0,
            fault_id="f",
            scope=FaultScope.PROCESS,
            reason="process_crash",
            time=at(9.75),
        ),
        RecoveryFinished(
            source=SOURCE,
            job=job,
            generation=1,
            fault_id="f",
            level=RecoveryLevel.PROCESS,
            reason="process_crash",
            duration_seconds=1.25,
            time=at(11),
        ),
        *[
            Progress(
                source=SOURCE, job=job, rank=0, local_rank=0, generation=1, step=s, time=at(6 + s)
            )
            for s in range(5, 13)
        ],
    ]
    summary = build_timeline(job, events).summary
    meter = GoodputMeter()
    for event in events:
        if isinstance(event, PhaseChanged):
            meter.phase(job, event.phase, T0, event.time)
        elif isinstance(event, Progress):
            meter.step(job, event.step, event.time)
        elif isinstance(event, FaultDetected):
            meter.fault(job, event.fault_id, event.time, exited=at(9.5))
        elif isinstance(event, RecoveryFinished):
            meter.restarted(job, event.duration_seconds)
    lost = meter.jobs[job].lost(events[-1].time)
    assert lost == pytest.approx(summary["lost_seconds"])
    assert lost["redone_steps"] > 0 and lost["detection"] > 0
    assert meter.jobs[job].goodput(events[-1].time) == pytest.approx(summary["goodput"], abs=1e-3)


def crash_loop(job: str) -> list[Event]:
    """Generations that start and die within a second, never a step nor a rendezvous,
    until the job fails: a crash loop."""
    events: list[Event] = [
        PhaseChanged(source=SOURCE, job=job, phase=JobPhase.PENDING, time=at(0)),
        PhaseChanged(source=SOURCE, job=job, phase=JobPhase.RUNNING, time=at(0.5)),
    ]
    for generation, died in enumerate([1.0, 3.0, 7.0, 15.0]):
        fault_id = f"crash:g{generation}"
        events += [
            FaultDetected(
                source=SOURCE, job=job, rank=1, generation=generation, fault_id=fault_id,
                scope=FaultScope.PROCESS, reason="process_crash", time=at(died),
            ),
            RecoveryStarted(
                source=SOURCE, job=job, fault_id=fault_id, level=RecoveryLevel.PROCESS,
                reason="process_crash", from_generation=generation, to_generation=generation + 1,
                time=at(died + 0.01),
            ),
        ]  # fmt: skip
    events.append(PhaseChanged(source=SOURCE, job=job, phase=JobPhase.FAILED, time=at(16)))
    return events


def test_a_job_that_never_trained_has_goodput_0_in_the_meter_and_the_report() -> None:
    job = "loop"
    events = crash_loop(job)
    summary = build_timeline(job, events).summary
    assert summary["goodput"] == 0.0 and summary["productive_seconds"] == 0.0
    meter = GoodputMeter()
    for event in events:
        if isinstance(event, PhaseChanged):
            meter.phase(job, event.phase, T0, event.time)
        elif isinstance(event, FaultDetected):
            meter.recovering(job, event.time)
    assert meter.jobs[job].goodput(at(16)) == 0.0
    assert meter.jobs[job].lost(at(16))["restart"] == 16.0


def test_a_recovery_that_never_ended_counts_until_the_next_one_began() -> None:
    """Generation 0 trained; generation 1 died before it trained; generation 2 trained
    after 1.5 s: 2 s lost to the first recovery, 1.5 s to the second."""
    meter = GoodputMeter()
    meter.phase("a", JobPhase.RUNNING, T0, at(0))
    meter.step("a", 1, at(1))
    meter.recovering("a", at(10))
    assert meter.jobs["a"].lost(at(11))["restart"] == 1.0  # still open
    meter.recovering("a", at(12))
    meter.restarted("a", 1.5)
    assert meter.jobs["a"].lost(at(20))["restart"] == 3.5


def test_a_step_from_before_the_first_fault_that_arrives_after_it_takes_the_time_back() -> None:
    # The restarter reads progress and faults from different streams: under load rank 0's
    # step 5 (trained at 4 s) can arrive after the fault detected at 6 s (a CI run saw it).
    meter = GoodputMeter()
    meter.phase("a", JobPhase.RUNNING, T0, at(1))
    meter.recovering("a", detected=at(6))
    assert meter.jobs["a"].lost(at(6))["restart"] == 6.0  # not trained, as far as it knows
    meter.step("a", 5, at(4))
    meter.restarted("a", 0.5)
    assert meter.jobs["a"].lost(at(10))["restart"] == 0.5
    # A step after the fault takes nothing back.
    late = GoodputMeter()
    late.phase("b", JobPhase.RUNNING, T0, at(1))
    late.recovering("b", detected=at(6))
    late.step("b", 1, at(7))
    assert late.jobs["b"].lost(at(7))["restart"] == 6.0 + 1.0  # and the open recovery
