"""A grow the scaler holds back shows in the job's status view (``heldGrow``), in a form
the TrainingJob status schema (the CRD's, on Kubernetes) keeps."""

from __future__ import annotations

from datetime import UTC, datetime

from resurge.control.state.records import HeldGrow, JobRecord, status_view
from resurge.events import JobPhase
from resurge.jobspec import TrainingJobStatus
from resurge.local.job_factory import job


def test_a_held_grow_is_in_the_status_view_and_the_status_schema_keeps_it() -> None:
    record = JobRecord(name="j", spec=job("j", replicas={"min": 1, "max": 4}))
    record.phase = JobPhase.RUNNING
    assert status_view(record)["heldGrow"] is None
    until = datetime(2026, 12, 4, 15, 42, 36, tzinfo=UTC)
    record.held_grow = HeldGrow(to_replicas=3, why="the snooze after a restart", until=until)
    view = status_view(record)
    assert view["heldGrow"] == {
        "to": 3,
        "why": "the snooze after a restart",
        "until": "2026-12-04T15:42:36+00:00",
    }
    status = TrainingJobStatus.model_validate({"heldGrow": view["heldGrow"]})
    assert status.held_grow is not None
    assert (status.held_grow.to, status.held_grow.until) == (3, until)
    assert status.model_dump(by_alias=True, mode="json")["heldGrow"]["why"] == (
        "the snooze after a restart"
    )


def test_a_finished_job_shows_no_held_grow() -> None:
    record = JobRecord(name="j", spec=job("j", replicas={"min": 1, "max": 4}))
    record.held_grow = HeldGrow(
        to_replicas=2, why="the snooze after a restart", until=datetime(2026, 1, 1, tzinfo=UTC)
    )
    record.phase = JobPhase.SUCCEEDED
    assert status_view(record)["heldGrow"] is None
