"""A job's status as its TrainingJob's status subresource: what the status writer writes
(every field of ``resurge status --json``, conditions, times) is what the CRD's status
schema keeps, nothing pruned; the write is a merge patch from the status read, with its
resourceVersion as a precondition, touching no condition or field it does not own."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from resurge.cluster.kubernetes.conditions import condition
from resurge.cluster.kubernetes.status import event_manifests, merge_diff, status_update
from resurge.contract.vocabulary import RecoveryLevel
from resurge.control.state.records import (
    CheckpointRef,
    HeldGrow,
    JobRecord,
    LastFault,
    LastRecovery,
    LastResize,
    PendingRecovery,
    Placement,
    RestoredState,
    status_view,
)
from resurge.events import JobPhase
from resurge.jobspec import JobSpecError, parse_job
from resurge.jobspec.crd import training_job_crd
from resurge.local.job_factory import job
from tests.kubernetes import admission
from tests.kubernetes.patches import merge_patch

T0 = datetime(2026, 12, 6, 1, 0, tzinfo=UTC)
NOW = "2026-12-06T02:00:00Z"
LATER = "2026-12-06T02:05:00Z"


def status_schema() -> dict[str, Any]:
    crd = training_job_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    return dict(schema)


def assert_kept_whole(status: dict[str, Any]) -> None:
    """``status`` survives the CRD's status schema as the API server applies it: nothing
    pruned, defaults add nothing, and it validates (test API server's admission)."""
    schema = status_schema()
    kept, removed = admission.prune(schema, status, root=False)
    assert removed == []
    assert admission.default(schema, kept, root=False) == status
    assert admission.validate(schema, status) == []


def record_in(phase: JobPhase, filled: bool) -> JobRecord:
    record = JobRecord(name="llama", spec=job("llama", replicas={"min": 1, "max": 4}))
    record.phase = phase
    record.generation = 3
    record.message = f"the job is {phase.value}"
    if not filled:
        return record
    record.placements = [Placement(replica=0, node="n1"), Placement(replica=1, node="n2")]
    record.restarts = {RecoveryLevel.PROCESS: 2, RecoveryLevel.NODE: 1}
    record.last_fault = LastFault(fault_id="f1", reason="exit code 1", scope="process", time=T0)
    record.last_recovery_seconds = 1.5
    record.last_recovery = LastRecovery(
        fault_id="f1", level=RecoveryLevel.PROCESS, reason="exit code 1", to_generation=3,
        seconds=1.5,
    )  # fmt: skip
    record.pending_recovery = PendingRecovery(
        fault_id="f2", level=RecoveryLevel.NODE, reason="XID 79", detected_at=T0,
        from_generation=3, to_generation=4, start_at=T0,
    )  # fmt: skip
    record.last_resize = LastResize(
        time=T0, resize="grow", from_replicas=1, to_replicas=2, why="free GPUs", to_generation=2,
        seconds=3.0,
    )  # fmt: skip
    record.held_grow = HeldGrow(to_replicas=4, why="the snooze after a restart", until=T0)
    record.latest_checkpoint = CheckpointRef(step=100, path="/ckpt/100")
    record.restored = RestoredState(
        generation=3, step=119, ranks={"memory": [0, 2], "peer": [1]}, detail="from rank 0"
    )
    record.avoid_nodes = ["n9"]
    record.spare_nodes = ["n3"]
    return record


def training_job(status: dict[str, Any] | None = None, generation: int = 2) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "llama", "namespace": "team", "uid": "u-1", "generation": generation,
                     "resourceVersion": "41"},
        "spec": {"command": ["python", "train.py"]},
    }  # fmt: skip
    if status is not None:
        obj["status"] = status
    return obj


def written(view: dict[str, object], obj: dict[str, Any], now: str = NOW) -> dict[str, Any]:
    """The status ``obj`` has after the status writer's patch is applied to it."""
    update = status_update(view, obj, now)
    assert update.patch is not None
    return dict(merge_patch(obj, update.patch)["status"])


# Nothing written is pruned


@pytest.mark.parametrize("filled", [False, True], ids=["bare", "filled"])
@pytest.mark.parametrize("phase", list(JobPhase))
def test_every_status_written_is_kept_whole_by_the_crd(phase: JobPhase, filled: bool) -> None:
    view = status_view(record_in(phase, filled))
    first = written(view, training_job())
    assert_kept_whole(first)
    # every field of the view is there, with the value the view gives it
    for key, value in view.items():
        if value is not None and key not in ("submitted", "lastFault", "lastResize", "heldGrow"):
            assert first[key] == value, key
    assert set(first) >= {k for k, v in view.items() if v is not None}
    # and again over a status that has every condition and a field of the controller's
    again = written(
        status_view(record_in(JobPhase.RECOVERING, filled=True)),
        training_job({**first, "submittedGeneration": 2}),
    )
    assert_kept_whole(again)
    assert again["submittedGeneration"] == 2


def test_what_the_controller_writes_is_kept_whole() -> None:
    """The controller's status (a rejected spec: phase, message, submittedGeneration,
    its Failed condition; a refused pod's PodsRefused), made with its own functions."""
    with pytest.raises(JobSpecError) as rejected:
        parse_job({**training_job(), "spec": {"command": [], "nprocPerNode": 0}})
    message = str(rejected.value)
    status = {
        "phase": "Failed",
        "message": message,
        "submittedGeneration": 1,
        "observedGeneration": 1,
        "conditions": [
            condition("Failed", True, "InvalidSpec", message, 1),
            condition("PodsRefused", True, "FailedCreatePod", 'pods "llama-0" is forbidden', 0),
        ],
    }
    schema = status_schema()
    assert admission.prune(schema, status, root=False)[1] == []
    assert admission.validate(schema, status) == []
    assert_kept_whole(written(status_view(record_in(JobPhase.FAILED, False)), training_job(status)))


def test_a_status_the_schema_does_not_have_is_seen_as_pruned() -> None:
    """The check above can fail: an unknown field (the old submittedSpec) is found."""
    _, removed = admission.prune(
        status_schema(), {"submittedSpec": "ab12", "replicas": {"x": 1}}, root=False
    )
    assert sorted(removed) == ["replicas.x", "submittedSpec"]


# Conditions


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_created_then_one_condition_per_phase_with_the_objects_generation() -> None:
    pending = written(status_view(record_in(JobPhase.PENDING, False)), training_job())
    assert {t: c["status"] for t, c in conditions(pending).items()} == {"Created": "True"}
    created = conditions(pending)["Created"]
    assert (created["reason"], created["observedGeneration"]) == ("Submitted", 2)
    assert pending["observedGeneration"] == 2

    running = written(status_view(record_in(JobPhase.RUNNING, False)), training_job(pending), LATER)
    got = conditions(running)
    assert {t: c["status"] for t, c in got.items()} == {"Created": "True", "Running": "True"}
    assert got["Created"]["lastTransitionTime"] == NOW  # its status did not change
    assert got["Running"]["lastTransitionTime"] == LATER
    assert got["Running"]["message"] == "the job is Running"
    assert running["startTime"] == LATER and "completionTime" not in running

    done = written(
        status_view(record_in(JobPhase.SUCCEEDED, False)), training_job(running, generation=3)
    )
    got = conditions(done)
    assert (got["Succeeded"]["status"], got["Succeeded"]["reason"]) == ("True", "Succeeded")
    assert (got["Running"]["status"], got["Running"]["reason"]) == ("False", "Succeeded")
    assert {c["observedGeneration"] for c in got.values()} == {3}
    assert done["startTime"] == LATER and done["completionTime"] == NOW
    assert list(got) == ["Created", "Running", "Succeeded"]


def test_a_suspended_job_has_the_suspended_condition_until_it_runs_again() -> None:
    record = record_in(JobPhase.PENDING, False)
    record.last_resize = LastResize(
        time=T0, resize="suspend", from_replicas=2, to_replicas=0, why="room for a higher "
        "priority job", to_generation=4,
    )  # fmt: skip
    suspended = written(status_view(record), training_job())
    assert conditions(suspended)["Suspended"]["status"] == "True"
    record.phase = JobPhase.RUNNING
    resumed = written(status_view(record), training_job(suspended))
    assert conditions(resumed)["Suspended"]["status"] == "False"
    assert conditions(resumed)["Running"]["status"] == "True"


def test_conditions_and_fields_of_other_writers_are_left_as_they_are() -> None:
    refused = {"type": "PodsRefused", "status": "True", "lastTransitionTime": NOW,
               "reason": "FailedCreatePod", "message": "forbidden"}  # fmt: skip
    before = {"phase": "Pending", "submittedGeneration": 2, "conditions": [refused]}
    update = status_update(status_view(record_in(JobPhase.RUNNING, False)), training_job(before))
    assert update.patch is not None
    assert "submittedGeneration" not in update.patch["status"]
    after = merge_patch(training_job(before), update.patch)["status"]
    assert after["submittedGeneration"] == 2
    assert conditions(after)["PodsRefused"] == refused


def test_a_condition_message_is_cut_to_what_a_condition_holds() -> None:
    record = record_in(JobPhase.FAILED, False)
    record.message = "x" * 40_000
    failed = written(status_view(record), training_job())
    assert len(conditions(failed)["Failed"]["message"]) == 32768
    assert failed["message"] == record.message
    assert_kept_whole(failed)


# The write itself


def test_the_patch_carries_the_resource_version_and_clears_what_is_gone() -> None:
    filled = written(status_view(record_in(JobPhase.RECOVERING, True)), training_job())
    record = record_in(JobPhase.RUNNING, True)
    record.pending_recovery = None  # the recovery finished
    record.last_resize = LastResize(
        time=T0, resize="shrink", from_replicas=2, to_replicas=1, to_generation=4
    )  # no seconds yet: the last resize's must not stay
    update = status_update(status_view(record), training_job(filled))
    assert update.patch is not None
    assert update.patch["metadata"] == {"resourceVersion": "41"}
    assert update.patch["status"]["recovery"] is None
    assert update.patch["status"]["lastResize"]["seconds"] is None
    after = merge_patch(training_job(filled), update.patch)["status"]
    assert "recovery" not in after and "seconds" not in after["lastResize"]
    assert after == update.after


def test_writing_the_same_status_again_writes_nothing() -> None:
    view = status_view(record_in(JobPhase.RUNNING, True))
    first = written(view, training_job())
    assert status_update(view, training_job(first), LATER).patch is None


def test_merge_diff_is_the_patch_from_one_document_to_the_other() -> None:
    before = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1], "f": "x"}
    after = {"a": 1, "b": {"c": 2, "g": 4}, "e": [1, 2]}
    diff = merge_diff(before, after)
    assert diff == {"b": {"d": None, "g": 4}, "e": [1, 2], "f": None}
    assert merge_patch(before, diff) == after


def test_events_come_from_the_status_read_not_the_view() -> None:
    """A recovery seen by a writer whose status read already holds it is no Event: the
    Events compare the status the write replaces with the one it writes."""
    view = status_view(record_in(JobPhase.RUNNING, True))
    obj = training_job()
    first = status_update(view, obj, NOW)
    assert [e["reason"] for e in event_manifests(obj, first.before, first.after)] == [
        "Recovering",
        "Recovered",
        "Resized",
    ]
    stored = training_job(first.after)
    second = status_update({**view, "message": "step 200"}, stored, LATER)
    assert event_manifests(stored, second.before, second.after) == []


def test_why_a_pending_job_waits_is_an_event_once_per_reason() -> None:
    """A job that fits nowhere says so where `kubectl describe` looks: a Warning Event
    (as kube-scheduler's FailedScheduling), again only when the reason's first clause
    changes, not each time a node's free count in it does."""
    record = record_in(JobPhase.PENDING, False)
    record.message = (
        "waiting for capacity: needs 1 node(s) with 2 free slot(s); gpu-a has 1 of 4 free"
    )
    obj = training_job()
    first = status_update(status_view(record), obj, NOW)
    [waiting] = event_manifests(obj, first.before, first.after)
    assert (waiting["reason"], waiting["type"]) == ("Waiting", "Warning")
    assert waiting["message"] == record.message
    stored = training_job(first.after)
    record.message = record.message.replace("1 of 4", "0 of 4")
    second = status_update(status_view(record), stored, LATER)
    assert event_manifests(stored, second.before, second.after) == []
    record.message = "no node of this cluster can hold it: no node lets its pods on (...)"
    third = status_update(status_view(record), stored, LATER)
    assert [e["reason"] for e in event_manifests(stored, third.before, third.after)] == ["Waiting"]
