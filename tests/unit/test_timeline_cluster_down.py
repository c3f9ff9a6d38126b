"""A local cluster stopped (`resurge down`) and started again mid-job: the time it was
down is lost time, by its own cause, and the world size is 0 meanwhile."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from resurge.control.views.timeline import CLUSTER_RESTARTED, build_timeline
from resurge.events import Assign, Event, JobPhase, PhaseChanged, Progress, ReplicaSlot, Source

T0 = datetime(2025, 1, 1, tzinfo=UTC)
SOURCE = Source(service="test", instance="t")
JOB = "j"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def phase(phase: JobPhase, seconds: float, message: str = "") -> PhaseChanged:
    return PhaseChanged(source=SOURCE, job=JOB, phase=phase, message=message, time=at(seconds))


def assign(generation: int, seconds: float) -> Assign:
    slots = [ReplicaSlot(replica=r, node=f"node-{r}", first_rank=r, nproc=1) for r in (0, 1)]
    return Assign(
        source=SOURCE,
        job=JOB,
        replica=0,
        generation=generation,
        world_size=2,
        rank_table=slots,
        master_addr="127.0.0.1",
        master_port=29500,
        time=at(seconds),
    )


def steps(generation: int, first: int, last: int, start: float) -> list[Event]:
    return [
        Progress(
            source=SOURCE,
            job=JOB,
            rank=0,
            local_rank=0,
            generation=generation,
            step=step,
            time=at(start + step - first),
        )
        for step in range(first, last + 1)
    ]


def story(pending_at_down: bool = False) -> list[Event]:
    """Trains 1 s a step from t=1 to t=11; the cluster goes down, starts again at t=71
    (the job requeued), runs again at t=73 and trains from t=74 to t=80."""
    before: list[Event] = [
        phase(JobPhase.PENDING, 0),
        phase(JobPhase.RUNNING, 1),
        assign(0, 1),
        *steps(0, 1, 10, 2),
    ]
    if pending_at_down:  # suspended at t=11.5, so the last event before the down
        before.append(phase(JobPhase.PENDING, 11.5))
    return [
        *before,
        phase(JobPhase.PENDING, 71, f"{CLUSTER_RESTARTED}: waiting for capacity to resume"),
        phase(JobPhase.RUNNING, 73),
        assign(1, 73),
        *steps(1, 11, 17, 74),
    ]


def test_the_time_the_cluster_was_down_is_lost_by_its_own_cause_with_no_world() -> None:
    timeline = build_timeline(JOB, story())
    summary = timeline.summary
    lost = summary["lost_seconds"]
    assert lost["cluster_down"] == pytest.approx(73 - 11)  # last step before it to running
    assert lost["waiting_for_capacity"] == 0
    assert summary["goodput"] == pytest.approx((80 - 62) / 80, abs=1e-3)
    assert timeline.world == [(1.0, 2), (11.0, 0), (73.0, 2)]


def test_waiting_before_the_cluster_went_down_is_not_counted_twice() -> None:
    lost = build_timeline(JOB, story(pending_at_down=True)).summary["lost_seconds"]
    assert lost["cluster_down"] == pytest.approx(73 - 11.5)
    assert lost["waiting_for_capacity"] == 0  # Pending only from its last event on
    assert sum(lost.values()) <= 80


def test_a_job_never_stopped_by_the_cluster_has_no_cluster_down_time() -> None:
    events = [phase(JobPhase.PENDING, 0), phase(JobPhase.RUNNING, 1), *steps(0, 1, 10, 2)]
    assert build_timeline(JOB, events).summary["lost_seconds"]["cluster_down"] == 0
