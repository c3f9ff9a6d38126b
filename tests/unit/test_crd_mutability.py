"""What can change on an existing TrainingJob: exactly what the scaler applies to a running
job (``update_live``), and the CRD's CEL transition rules refuse every other edit.

The rules are evaluated with cel-python, as the test API server evaluates them, following
"Validation rules" and "Transition rules" in the Kubernetes documentation ("Extend the
Kubernetes API with CustomResourceDefinitions") and "Enforce CRD Immutability with CEL
Transition Rules" (kubernetes.io/blog/2022/09/29/enforce-immutability-using-cel)."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from resurge.control.decisions.admission import update_live
from resurge.control.state.records import JobRecord
from resurge.events import JobPhase
from resurge.jobspec import parse_job
from resurge.jobspec.crd import training_job_crd
from resurge.jobspec.mutability import MUTABLE

BASE: dict[str, Any] = {
    "command": ["python", "train.py"],
    "image": "registry/train:1",
    "nprocPerNode": 2,
    "replicas": {"min": 2, "max": 4},
    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
    "queue": "team-queue",
}

# One edit of every spec field (and of each replica bound), by its dotted path.
EDITS: dict[str, Any] = {
    "spec.command": ["python", "other.py"],
    "spec.image": "registry/train:2",
    "spec.template": {"spec": {"nodeSelector": {"pool": "a100"}}},
    "spec.nprocPerNode": 4,
    "spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
    "spec.workingDir": "/work",
    "spec.forkServer": False,
    "spec.preloadModules": ["torch"],
    "spec.replicas.min": 1,
    "spec.replicas.max": 8,
    "spec.replicas.step": 2,
    "spec.elastic": {"scaleUpSnoozeSeconds": 600},
    "spec.priority": 5,
    "spec.priorityClassName": "high",
    "spec.queue": "other-queue",
    "spec.suspend": True,
    "spec.recovery": {"jobMaxRetryCount": 3},
    "spec.monitoring": {"heartbeatTimeoutSeconds": 120},
    "spec.checkpoint": {"dir": "/ckpt/llama"},
}


def document(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "llama"},
        "spec": spec,
    }


def edited(path: str) -> dict[str, Any]:
    spec = {**BASE, "replicas": dict(BASE["replicas"])}
    parts = path.split(".")[1:]
    (spec["replicas"] if parts[0] == "replicas" else spec)[parts[-1]] = EDITS[path]
    return spec


def as_stored(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as the API server stores it: the models' defaults filled in."""
    stored = parse_job(document(spec)).spec
    return stored.model_dump(by_alias=True, mode="json", exclude_none=True)


def refused(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The messages of the CRD's rules on ``spec`` and ``spec.replicas`` that the update
    from ``old`` to ``new`` breaks."""
    schema = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    env = celpy.Environment()
    messages = []
    for node, before, after in (
        (spec, old, new),
        (spec["properties"]["replicas"], old.get("replicas"), new.get("replicas")),
    ):
        for rule in node.get("x-kubernetes-validations", []):
            if before is None or after is None:
                continue  # a transition rule runs only where both values exist
            program = env.program(env.compile(rule["rule"]))
            context = {"self": json_to_cel(after), "oldSelf": json_to_cel(before)}
            if not bool(program.evaluate(context)):
                messages.append(rule["message"])
    return messages


@pytest.mark.parametrize("path", sorted(EDITS))
def test_an_edit_is_refused_unless_the_field_is_mutable(path: str) -> None:
    messages = refused(as_stored(BASE), as_stored(edited(path)))
    if path in MUTABLE or any(path.startswith(f"{m}.") for m in MUTABLE):
        assert messages == []
    else:
        split = any(m.startswith("spec.replicas.") for m in MUTABLE)
        field = path if path.count(".") == 1 or split else "spec.replicas"
        assert messages == [f"{field} is immutable: delete the TrainingJob and create it again"]


def test_an_unchanged_spec_and_a_label_pass() -> None:
    assert refused(as_stored(BASE), as_stored(BASE)) == []


def test_the_mutable_fields_are_exactly_what_a_running_job_takes() -> None:
    """``update_live`` (the scaler, for a running job submitted again) applies every
    mutable field and nothing else, so no edit the CRD lets through is ignored."""
    for path in EDITS:
        old = parse_job(document(BASE))
        new = parse_job(document(edited(path)))
        record = JobRecord(name="llama", spec=old)
        record.phase = JobPhase.RUNNING
        update_live(record, new)
        taken = record.spec.spec != old.spec
        assert taken == (path in MUTABLE), path
        if taken:
            assert record.spec == new


def test_the_spec_rules_name_every_immutable_field() -> None:
    schema = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    named = {r["message"].split(" ")[0] for r in spec["x-kubernetes-validations"]}
    fields = {f"spec.{name}" for name in spec["properties"]}
    assert named == fields - {p for p in fields if any(m.startswith(p) for m in MUTABLE)}
    assert "spec.command" in named and "spec.monitoring" not in named


def test_a_max_below_min_or_below_a_discrete_size_is_refused() -> None:
    """``replicas.max`` may change, but not to what the models refuse: the API server
    says so instead of the edit reaching a running job."""
    old = as_stored({**BASE, "replicas": {"min": 2, "max": 4, "discrete": [2, 4]}})
    lower = {**old, "replicas": {**old["replicas"], "max": 1}}
    assert refused(old, lower) == [
        "spec.replicas.max must be at least spec.replicas.min",
        "spec.replicas.discrete sizes must be at most spec.replicas.max",
    ]
    assert refused(old, {**old, "replicas": {**old["replicas"], "max": 6}}) == []
