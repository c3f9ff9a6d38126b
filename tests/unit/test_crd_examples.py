"""Every example TrainingJob against the CRD's openAPIV3Schema, as the API server
validates a custom resource; and bad fields rejected with their path named."""

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from resurge.jobspec import load_job, parse_job
from resurge.jobspec.crd import training_job_crd
from tests.kubernetes import admission
from tests.unit.test_jobspec import doc_example

REPO = Path(__file__).resolve().parents[2]

_TYPE = jsonschema.Draft4Validator.VALIDATORS["type"]
_ENUM = jsonschema.Draft4Validator.VALIDATORS["enum"]


def _nullable(check: Any) -> Any:
    def validate(validator: Any, value: Any, instance: Any, schema: dict[str, Any]) -> Any:
        if instance is None and schema.get("nullable") is True:
            return iter(())
        return check(validator, value, instance, schema)

    return validate


# OpenAPI 3.0 is JSON Schema draft 4 (boolean exclusiveMinimum) plus `nullable`.
OpenApiValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator, {"type": _nullable(_TYPE), "enum": _nullable(_ENUM)}
)


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with unknown fields refused where Kubernetes' strict field validation
    refuses them: in every object with properties that does not preserve unknown fields."""
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        stack += node.get("properties", {}).values()
        stack += [node[key] for key in ("items", "additionalProperties") if key in node]
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    schema["properties"]["metadata"]["additionalProperties"] = True  # Kubernetes' ObjectMeta
    return schema


SCHEMA = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
PRUNING = OpenApiValidator(SCHEMA)
STRICT = OpenApiValidator(_closed(SCHEMA))


def as_sent(document: Any) -> Any:
    """The document as kubectl sends it: JSON, so YAML's integer map keys are strings."""
    return json.loads(json.dumps(document))


def errors(document: Any, validator: Any = STRICT) -> list[str]:
    """Each error as ``dotted.path: message``, sorted."""
    found = validator.iter_errors(as_sent(document))
    return sorted(
        f"{'.'.join(str(part) for part in error.absolute_path)}: {error.message}" for error in found
    )


def example_files() -> Iterator[Path]:
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        if "TrainingJob" in path.read_text():
            yield path


EXAMPLES = {str(path.relative_to(REPO)): path for path in example_files()}


def test_the_examples_are_all_found() -> None:
    assert {"examples/ddp/job.yaml", "examples/kubernetes/ddp-job.yaml"} <= set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_job_is_valid_for_the_crd(name: str) -> None:
    document = yaml.safe_load(EXAMPLES[name].read_text())
    assert document["apiVersion"] == "resurge.dev/v1alpha1"
    assert errors(document) == []
    load_job(EXAMPLES[name])  # and for the models


def test_the_full_example_in_the_docs_is_valid_for_the_crd() -> None:
    document = doc_example()
    assert document["status"]["restarts"] and document["spec"]["monitoring"]["gpu"]
    assert errors(document) == []


def test_the_kubernetes_example_runs_the_ddp_example() -> None:
    local = load_job(REPO / "examples" / "ddp" / "job.yaml")
    kubernetes = load_job(REPO / "examples" / "kubernetes" / "ddp-job.yaml")
    assert kubernetes.spec.image and kubernetes.spec.working_dir
    kubernetes_only = {"image", "working_dir"}
    assert kubernetes.spec.model_dump(exclude=kubernetes_only) == local.spec.model_dump(
        exclude=kubernetes_only
    )
    assert kubernetes.name == local.name


def minimal(**spec: object) -> dict[str, Any]:
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {"command": ["python", "train.py"], **spec},
    }


@pytest.mark.parametrize(
    ("document", "named"),
    [
        (minimal(nprocPerNode=0), "spec.nprocPerNode: 0 is less than the minimum of 1"),
        (minimal(replicas={"min": "two"}), "spec.replicas.min: 'two' is not of type 'integer'"),
        (minimal(recovery={"levels": ["reboot"]}), "spec.recovery.levels.0: 'reboot' is not one"),
        (minimal(command=[]), "spec.command: [] should be non-empty"),
        (
            minimal(monitoring={"logRules": [{"name": "r", "logPattern": "x", "action": "x"}]}),
            "spec.monitoring.logRules.0.action: 'x' is not one of ['restart', 'alert']",
        ),
        (minimal(elastic={"checkpointTimeoutSeconds": 0}), "spec.elastic.checkpointTimeoutSeconds"),
        ({**minimal(), "metadata": {"name": "Bad_Name"}}, "metadata.name: 'Bad_Name' does not"),
        ({**minimal(), "apiVersion": "resurge.dev/v1"}, "apiVersion: 'resurge.dev/v1' is not one"),
    ],
)
def test_a_wrong_value_is_rejected_naming_the_field(document: dict[str, Any], named: str) -> None:
    found = errors(document, PRUNING)
    assert len(found) == 1 and found[0].startswith(named), found


def test_an_unknown_field_is_rejected_naming_it() -> None:
    document = minimal(nprocPerNod=2, replicas={"min": 1, "mx": 2})
    assert errors(document) == [
        "spec.replicas: Additional properties are not allowed ('mx' was unexpected)",
        "spec: Additional properties are not allowed ('nprocPerNod' was unexpected)",
    ]
    assert errors(document, PRUNING) == [], "without strict validation Kubernetes prunes them"


def test_free_maps_and_nulls_pass_as_kubernetes_lets_them() -> None:
    template = {"spec": {"nodeSelector": {"any": "thing"}, "tolerations": [{"key": "gpu"}]}}
    document = minimal(template=template, image=None, checkpoint={"dir": None})
    assert errors(document) == []
    not_nullable = "spec.nprocPerNode: None is not of type 'integer'"
    assert errors(minimal(nprocPerNode=None)) == [not_nullable]


def test_hyperpod_spellings_are_for_the_models_not_the_crd() -> None:
    document = minimal(elastic={"scaleUpSnoozeTimeInSeconds": 30}, elasticPolicy={"minReplicas": 1})
    assert parse_job(document).spec.elastic.scale_up_snooze_seconds == 30
    assert errors(document) == [
        "spec.elastic: Additional properties are not allowed "
        "('scaleUpSnoozeTimeInSeconds' was unexpected)",
        "spec: Additional properties are not allowed ('elasticPolicy' was unexpected)",
    ]


def test_status_restarts_take_recovery_levels_only() -> None:
    status = {"restarts": {"process": 2, "node": 1}, "replicas": {"current": 1, "target": 2}}
    assert errors({**minimal(), "status": status}) == []
    status["restarts"] = {"reboot": 1}
    assert errors({**minimal(), "status": status}) == [
        "status.restarts: Additional properties are not allowed ('reboot' was unexpected)"
    ]


def test_a_memory_budget_is_an_integer_or_a_string_for_the_api_server() -> None:
    """The CRD takes memoryBudget as Kubernetes takes a quantity (int-or-string); what
    the string says is resurge's check (the models')."""
    for budget in ("8Gi", 8 * 2**30):
        assert admission.validate(SCHEMA, minimal(checkpoint={"memoryBudget": budget})) == []
    for wrong in (1.5, True):
        error = admission.validate(SCHEMA, minimal(checkpoint={"memoryBudget": wrong}))[0]
        assert error.startswith("spec.checkpoint.memoryBudget: Invalid value"), error
        assert "must be of type int-or-string" in error, error
