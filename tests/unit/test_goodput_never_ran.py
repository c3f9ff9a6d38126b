"""A job that never ran (Pending from its submission on, say for want of a node that can
hold it) has goodput 0, not 100%, in the live meter and in the report's timeline: all
its time so far went waiting for capacity."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from resurge.contract.vocabulary import JobPhase
from resurge.control.views.goodput_meter import GoodputMeter
from resurge.control.views.timeline import build_timeline
from resurge.events import Event, JobSubmitted, PhaseChanged, Source
from resurge.local.job_factory import job

T0 = datetime(2025, 1, 1, tzinfo=UTC)
SOURCE = Source(service="test", instance="t")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_job_that_never_ran_has_goodput_0_in_the_meter_and_the_report() -> None:
    events: list[Event] = [
        JobSubmitted(source=SOURCE, job="big", spec=job("big", nproc=2), time=at(0)),
        PhaseChanged(source=SOURCE, job="big", phase=JobPhase.PENDING, time=at(0.1)),
        PhaseChanged(
            source=SOURCE, job="big", phase=JobPhase.PENDING, message="still", time=at(30)
        ),
    ]
    summary = build_timeline("big", events).summary
    assert summary["goodput"] == 0.0
    assert summary["lost_seconds"]["waiting_for_capacity"] == summary["wall_seconds"] == 30.0
    meter = GoodputMeter()
    meter.phase("big", JobPhase.PENDING, T0, at(0.1))
    assert meter.jobs["big"].goodput(at(30)) == 0.0
    assert meter.jobs["big"].lost(at(30))["waiting_for_capacity"] == 30.0


def test_once_it_ran_its_wait_before_the_first_run_is_not_lost_time() -> None:
    meter = GoodputMeter()
    meter.phase("big", JobPhase.PENDING, T0, at(0))
    meter.phase("big", JobPhase.RUNNING, T0, at(10))
    assert meter.jobs["big"].goodput(at(20)) == 1.0
