"""A job's runs from its job events, and the events of one run (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from resurge.control.views.job_overview import past_run_view, summarize
from resurge.control.views.runs import Run, run_events, runs_of
from resurge.events import (
    Assign,
    Event,
    JobDeleted,
    JobPhase,
    JobSubmitted,
    PhaseChanged,
    Progress,
    RecoveryLevel,
    RecoveryStarted,
    ReplicaSlot,
    Source,
)
from resurge.local import job_factory

SOURCE = Source(service="t", instance="t")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def submitted(seconds: float, uid: str) -> JobSubmitted:
    spec = job_factory.job("j", nproc=1, preload=None)
    return JobSubmitted(id=uid, source=SOURCE, job="j", spec=spec, time=at(seconds))


def deleted(seconds: float) -> JobDeleted:
    return JobDeleted(source=SOURCE, job="j", time=at(seconds))


def progress(seconds: float, step: int, generation: int = 0) -> Progress:
    return Progress(
        source=SOURCE,
        job="j",
        generation=generation,
        rank=0,
        local_rank=0,
        step=step,
        time=at(seconds),
    )


def assign(seconds: float, uid: str) -> Assign:
    return Assign(
        source=SOURCE,
        uid=uid,
        job="j",
        replica=0,
        generation=0,
        world_size=1,
        rank_table=[ReplicaSlot(replica=0, node="n", first_rank=0, nproc=1)],
        master_addr="127.0.0.1",
        master_port=29500,
        time=at(seconds),
    )


def test_a_job_deleted_and_submitted_again_has_two_runs_and_an_update_is_no_run() -> None:
    events: list[Event] = [
        submitted(0, "a"),
        submitted(5, "update"),  # monitoring changed while it ran
        deleted(10),
        submitted(20, "b"),
    ]
    assert runs_of(events) == [Run("a", at(0), at(10)), Run("b", at(20))]
    # A finished job submitted again without a delete: its uid names a run too.
    assert runs_of(events, "update")[-2:] == [Run("update", at(5), at(10)), Run("b", at(20))]


def test_the_new_run_sees_only_its_own_steps_phases_and_commands() -> None:
    old, new = Run("a", at(0), at(10)), Run("b", at(20))
    events: list[Event] = [
        assign(1, "a"),
        progress(2, 500),
        RecoveryStarted(
            source=SOURCE,
            job="j",
            fault_id="f",
            level=RecoveryLevel.PROCESS,
            reason="process_crash",
            from_generation=0,
            to_generation=1,
            time=at(3),
        ),
        PhaseChanged(source=SOURCE, job="j", phase=JobPhase.SUCCEEDED, time=at(4)),
        assign(21, "b"),
        assign(21.5, "a"),  # an old run's command stored late
        progress(22, 1),
        progress(22.5, 500, generation=5),  # an old run's worker, still stopping
    ]
    mine = run_events(events, new)
    assert [e.time for e in mine] == [at(21), at(22)]
    assert summarize("j", mine).step == 1
    view = past_run_view("j", old, run_events(events, old))
    assert view["uid"] == "a" and view["phase"] == "Succeeded" and view["step"] == 500
    assert view["restarts"] == {"process": 1}
