"""The Kubernetes objects the backend reads: whatever a Node, pod or TrainingJob holds,
reading it gives a value or a clear, caught error, never a crash of the watch."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from resurge.cluster.kubernetes.jobs import generation_of
from resurge.cluster.kubernetes.objects import (
    GPU_RESOURCE,
    MONITOR_ANNOTATION,
    group_of_pod,
    monitor_report,
    node_info,
)
from resurge.cluster.protocol import NodeInfo, WorkerGroupSpec
from resurge.jobspec import JobSpecError, parse_job
from tests.property.strategies import VALID_JOB_DOCUMENT, json_values

REPORT = json.dumps(
    {"slots": 4, "healthy": True, "address": "10.0.0.9", "heartbeat": "2026-01-01T00:00:00Z"}
)
NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-1",
        "labels": {"zone": "a"},
        "annotations": {MONITOR_ANNOTATION: REPORT},
        "creationTimestamp": "2026-01-01T00:00:00Z",
    },
    "spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]},
    "status": {
        "allocatable": {GPU_RESOURCE: "8"},
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        "conditions": [
            {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}
        ],
    },
}

json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=6)


def paths(document: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found: list[tuple[str | int, ...]] = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += paths(value, (*prefix, index))
    return found


def replaced(document: Any, path: tuple[str | int, ...], value: Any) -> Any:
    changed = copy.deepcopy(document)
    parent = changed
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return changed


def test_the_well_formed_node_reads_as_expected() -> None:
    info = node_info(NODE)
    # Slots are the node's allocatable accelerators (8), whatever its monitor counts (4).
    assert (info.name, info.slots, info.healthy, info.address) == ("gpu-1", 8, True, "10.0.0.1")


@given(json_objects)
def test_any_object_reads_as_a_node(node: dict[str, Any]) -> None:
    assert isinstance(node_info(node), NodeInfo)


@given(st.sampled_from(paths(NODE)), json_values)
def test_a_node_with_any_part_malformed_still_reads(
    path: tuple[str | int, ...], value: Any
) -> None:
    info = node_info(replaced(NODE, path, value))
    assert isinstance(info, NodeInfo)
    assert info.slots >= 0


def test_malformed_nodes_degrade_to_no_slots_instead_of_crashing() -> None:
    allocatable: object
    for allocatable in ["abc", "1.5", "4Gi", "-3", "9" * 5000, None, [], {}]:
        node = replaced(NODE, ("status", "allocatable", GPU_RESOURCE), allocatable)
        assert node_info(node).slots == (4 if allocatable is None else 0), allocatable
    assert node_info(replaced(NODE, ("status", "conditions"), "Ready")).healthy
    assert node_info(replaced(NODE, ("status", "addresses"), [{"type": "InternalIP"}])).address == (
        "10.0.0.9"  # the monitor's
    )
    assert node_info(replaced(NODE, ("spec", "taints"), {"key": "v"})).name == "gpu-1"
    assert node_info(replaced(NODE, ("metadata",), "gpu-1")).name == "None"


@given(json_values)
def test_any_monitor_annotation_is_a_report_or_none(value: Any) -> None:
    node = replaced(NODE, ("metadata", "annotations", MONITOR_ANNOTATION), value)
    monitor_report(node)
    assert isinstance(node_info(node), NodeInfo)


@given(st.one_of(json_values, json_values.map(json.dumps), st.text(max_size=50)))
def test_any_group_annotation_is_a_group_or_none(value: Any) -> None:
    pod = {"metadata": {"annotations": {"resurge.dev/worker-group": value}}}
    group = group_of_pod(pod)
    assert group is None or isinstance(group, WorkerGroupSpec)
    assert group_of_pod({"metadata": {"annotations": value}}) is None
    assert group_of_pod({"metadata": value}) is None


def test_deeply_nested_group_annotation_is_none() -> None:
    pod = {"metadata": {"annotations": {"resurge.dev/worker-group": "[" * 100_000}}}
    assert group_of_pod(pod) is None


@given(json_objects)
def test_the_generation_of_any_object_is_a_positive_int(training_job: dict[str, Any]) -> None:
    generation = generation_of(training_job)
    assert type(generation) is int and generation >= 1


@given(json_values, json_values)
def test_the_controllers_document_of_any_training_job_is_a_job_or_a_job_spec_error(
    spec: Any, labels: Any
) -> None:
    """The document the controller builds from a TrainingJob object (its name, labels
    and spec) goes through parse_job; any spec and labels give a job or a JobSpecError."""
    for candidate in (spec, {**VALID_JOB_DOCUMENT["spec"], "x": spec}):
        document = {
            "apiVersion": "resurge.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "j", "namespace": "default", "labels": labels or {}},
            "spec": candidate,
        }
        try:
            parse_job(document)
        except JobSpecError as error:
            assert "spec" in str(error) or "labels" in str(error)
