"""The controller's own status writes (a rejected spec, the PodsRefused condition) are
kept whole by the TrainingJob CRD's status schema (tests/kubernetes/admission.py prunes
and validates as the API server does), and a condition of one type replaces
only that type's."""

from __future__ import annotations

from resurge.cluster.kubernetes.conditions import condition, with_condition
from resurge.cluster.kubernetes.jobs import PODS_REFUSED, rejected_status
from tests.kubernetes import admission
from tests.unit.test_kubernetes_status import status_schema


def assert_kept_whole(fields: dict[str, object]) -> None:
    """Status fields merged into a TrainingJob's status lose nothing to the CRD's status
    schema and validate (the API server then adds its defaults for fields not given)."""
    schema = status_schema()
    kept, removed = admission.prune(schema, fields, root=False)
    assert removed == [] and kept == fields
    assert admission.validate(schema, admission.default(schema, kept, root=False)) == []


MESSAGE = "invalid TrainingJob: spec.replicas: replicas.max (2) is below replicas.min (3)"


def test_a_rejected_spec_status_is_kept_whole_by_the_crd() -> None:
    status = rejected_status({}, 3, MESSAGE)
    assert_kept_whole(status)
    [failed] = status["conditions"]
    assert (failed["type"], failed["status"], failed["reason"]) == ("Failed", "True", "InvalidSpec")
    assert failed["observedGeneration"] == 3 and failed["message"] == MESSAGE


def test_pods_refused_is_kept_whole_beside_the_status_writers_conditions() -> None:
    running = condition("Running", True, "Running", "", 2)
    refused = condition(PODS_REFUSED, True, "FailedCreatePod", 'pods "x" is forbidden', 2)
    conditions = with_condition([running], refused)
    assert [c["type"] for c in conditions] == ["Running", PODS_REFUSED]
    assert_kept_whole({"phase": "Running", "conditions": conditions})


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = {**condition(PODS_REFUSED, True, "FailedCreatePod", "a", 1), "lastTransitionTime": "T0"}
    again = with_condition([first], condition(PODS_REFUSED, True, "FailedCreatePod", "b", 1))
    assert again[0]["lastTransitionTime"] == "T0" and again[0]["message"] == "b"
    cleared = with_condition(again, condition(PODS_REFUSED, False, "PodCreated", "", 1))
    assert cleared[0]["status"] == "False" and cleared[0]["lastTransitionTime"] != "T0"
