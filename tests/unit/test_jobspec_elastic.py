"""spec.elastic, HyperPod's elasticPolicy on spec, and the replica sizes the scaler uses."""

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from resurge.jobspec import ElasticSpec, JobSpecError, ReplicaSpec, TrainingJob, parse_job
from resurge.jobspec.elastic import ELASTIC_POLICY_FIELDS

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "jobspec.md"

# As HyperPod's documentation writes it under a HyperPodPyTorchJob's spec, less its
# scalingTimeoutInSeconds, which resurge refuses (test_scaling_timeout_is_refused...).
HYPERPOD_SNIPPET = """
elasticPolicy:
  minReplicas: 2
  maxReplicas: 8
  replicaIncrementStep: 2
  gracefulShutdownTimeoutInSeconds: 120
  faultyScaleDownTimeoutInSeconds: 45
"""


def minimal(**spec: object) -> dict[str, object]:
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {"command": ["python", "train.py"], **spec},
    }


def rejected(**spec: object) -> str:
    with pytest.raises(JobSpecError) as caught:
        parse_job(minimal(**spec))
    return str(caught.value)


def test_defaults() -> None:
    spec = parse_job(minimal()).spec
    assert spec.elastic == ElasticSpec()
    elastic = spec.elastic
    assert elastic.cooldown_seconds == 60.0
    assert elastic.scale_up_snooze_seconds == 60.0
    assert elastic.checkpoint_timeout_seconds == 30.0
    assert elastic.scaling_timeout_seconds == 300.0
    assert spec.recovery.faulty_scale_down_timeout_seconds == 60.0
    assert spec.replicas == ReplicaSpec() and spec.replicas.allowed_sizes() == [1]


def test_wire_names_are_the_ones_the_scaler_reads() -> None:
    dumped = ElasticSpec().model_dump(by_alias=True)
    assert set(dumped) == {
        "cooldownSeconds",
        "scaleUpSnoozeSeconds",
        "checkpointTimeoutSeconds",
        "scalingTimeoutSeconds",
    }
    for field in ElasticSpec.model_fields.values():
        assert field.description and len(field.description) > 20


@pytest.mark.parametrize(
    ("key", "attribute"),
    [
        ("cooldownSeconds", "cooldown_seconds"),
        ("cooldown_seconds", "cooldown_seconds"),
        ("scaleUpSnoozeSeconds", "scale_up_snooze_seconds"),
        ("scaleUpSnoozeTimeInSeconds", "scale_up_snooze_seconds"),
        ("scale_up_snooze_seconds", "scale_up_snooze_seconds"),
        ("checkpointTimeoutSeconds", "checkpoint_timeout_seconds"),
        ("gracefulShutdownTimeoutInSeconds", "checkpoint_timeout_seconds"),
        ("checkpoint_timeout_seconds", "checkpoint_timeout_seconds"),
        ("scalingTimeoutSeconds", "scaling_timeout_seconds"),
        ("scaling_timeout_seconds", "scaling_timeout_seconds"),
    ],
)
def test_each_spelling_sets_its_field(key: str, attribute: str) -> None:
    elastic = parse_job(minimal(elastic={key: 7})).spec.elastic
    assert getattr(elastic, attribute) == 7.0
    others = {name for name in ElasticSpec.model_fields if name != attribute}
    assert all(getattr(elastic, name) == getattr(ElasticSpec(), name) for name in others)


@pytest.mark.parametrize(
    ("ours", "hyperpods"),
    [
        ("scaleUpSnoozeSeconds", "scaleUpSnoozeTimeInSeconds"),
        ("checkpointTimeoutSeconds", "gracefulShutdownTimeoutInSeconds"),
    ],
)
def test_both_spellings_at_once_are_rejected(ours: str, hyperpods: str) -> None:
    message = rejected(elastic={ours: 5, hyperpods: 5})
    assert f"spec.elastic: {ours} and {hyperpods} name the same field" in message


def test_snooze_and_cooldown_may_be_zero() -> None:
    elastic = parse_job(minimal(elastic={"cooldownSeconds": 0, "scaleUpSnoozeSeconds": 0}))
    assert elastic.spec.elastic.cooldown_seconds == 0
    assert elastic.spec.elastic.scale_up_snooze_seconds == 0


@pytest.mark.parametrize(
    ("elastic", "named"),
    [
        ({"cooldownSeconds": -1}, "spec.elastic.cooldownSeconds: Input should be greater than or"),
        ({"scaleUpSnoozeTimeInSeconds": -5}, "spec.elastic.scaleUpSnoozeTimeInSeconds: Input"),
        ({"checkpointTimeoutSeconds": 0}, "spec.elastic.checkpointTimeoutSeconds: Input should be"),
        ({"scalingTimeoutSeconds": -1}, "spec.elastic.scalingTimeoutSeconds: Input should be"),
        ({"scalingTimeoutSeconds": "soon"}, "spec.elastic.scalingTimeoutSeconds: Input should be"),
        ({"cooldown": 5}, "unknown field spec.elastic.cooldown, did you mean cooldownSeconds?"),
    ],
)
def test_bad_elastic_values_are_named(elastic: dict[str, object], named: str) -> None:
    assert named in rejected(elastic=elastic)


def test_hyperpod_elastic_policy_pasted_as_is() -> None:
    spec = parse_job(minimal(**yaml.safe_load(HYPERPOD_SNIPPET))).spec
    assert (spec.replicas.min, spec.replicas.max, spec.replicas.step) == (2, 8, 2)
    assert spec.replicas.discrete is None
    assert spec.replicas.allowed_sizes() == [2, 4, 6, 8] and spec.replicas.elastic
    assert spec.elastic.checkpoint_timeout_seconds == 120
    assert spec.elastic.scaling_timeout_seconds == 300  # untouched: the default
    assert spec.elastic.cooldown_seconds == 60.0  # not in the block: the default
    assert spec.recovery.faulty_scale_down_timeout_seconds == 45


def test_elastic_policy_with_discrete_sizes() -> None:
    policy = {"minReplicas": 2, "maxReplicas": 16, "replicaDiscreteValues": [16, 2, 8]}
    replicas = parse_job(minimal(elasticPolicy=policy)).spec.replicas
    assert replicas.discrete == [2, 8, 16] and replicas.step is None
    assert replicas.allowed_sizes() == [2, 8, 16]


def test_elastic_policy_fills_only_what_it_names() -> None:
    spec = parse_job(
        minimal(
            elasticPolicy={"maxReplicas": 6},
            replicas={"min": 2},
            elastic={"cooldownSeconds": 10},
            recovery={"spares": 1},
        )
    ).spec
    assert (spec.replicas.min, spec.replicas.max) == (2, 6)
    assert spec.elastic.cooldown_seconds == 10 and spec.recovery.spares == 1


def test_elastic_policy_in_the_docs_parses() -> None:
    text = DOC.read_text()
    block = re.search(r"### spec\.elasticPolicy\n.*?```yaml\n(.*?)```", text, re.DOTALL)
    assert block is not None, "docs/jobspec.md lost its elasticPolicy example"
    spec = parse_job(minimal(**yaml.safe_load(block.group(1)))).spec
    assert spec.replicas.elastic
    assert spec.elastic.checkpoint_timeout_seconds != ElasticSpec().checkpoint_timeout_seconds


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"replicas": {"min": 2}}, "minReplicas"),
        ({"replicas": {"max": 8}}, "maxReplicas"),
        ({"replicas": {"step": 2, "max": 8}}, "replicaIncrementStep"),
        ({"replicas": {"discrete": [2, 8], "max": 8}}, "replicaDiscreteValues"),
        ({"elastic": {"checkpointTimeoutSeconds": 120}}, "gracefulShutdownTimeoutInSeconds"),
        (
            {"elastic": {"gracefulShutdownTimeoutInSeconds": 120}},
            "gracefulShutdownTimeoutInSeconds",
        ),
        ({"recovery": {"faultyScaleDownTimeoutSeconds": 45}}, "faultyScaleDownTimeoutInSeconds"),
        (
            {"recovery": {"faulty_scale_down_timeout_seconds": 45}},
            "faultyScaleDownTimeoutInSeconds",
        ),
    ],
)
def test_same_value_both_ways_is_accepted(section: dict[str, Any], key: str) -> None:
    policy = yaml.safe_load(HYPERPOD_SNIPPET)["elasticPolicy"]
    if key == "replicaDiscreteValues":
        policy = {"minReplicas": 2, "maxReplicas": 8, "replicaDiscreteValues": [8, 2]}
    both = parse_job(minimal(elasticPolicy=policy, **section)).spec
    assert both == parse_job(minimal(elasticPolicy=policy)).spec


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"replicas": {"min": 3}}, "elasticPolicy.minReplicas (2) and replicas.min (3)"),
        ({"replicas": {"max": 4}}, "elasticPolicy.maxReplicas (8) and replicas.max (4)"),
        ({"replicas": {"step": 1}}, "elasticPolicy.replicaIncrementStep (2) and replicas.step (1)"),
        (
            {"elastic": {"checkpointTimeoutSeconds": 30}},
            "elasticPolicy.gracefulShutdownTimeoutInSeconds (120) and "
            "elastic.checkpointTimeoutSeconds (30)",
        ),
        (
            {"elastic": {"gracefulShutdownTimeoutInSeconds": 30}},
            "elasticPolicy.gracefulShutdownTimeoutInSeconds (120) and "
            "elastic.gracefulShutdownTimeoutInSeconds (30)",
        ),
        (
            {"recovery": {"faultyScaleDownTimeoutInSeconds": 60}},
            "elasticPolicy.faultyScaleDownTimeoutInSeconds (45) and "
            "recovery.faultyScaleDownTimeoutInSeconds (60)",
        ),
    ],
)
def test_different_values_both_ways_are_rejected_naming_both(
    section: dict[str, Any], named: str
) -> None:
    message = rejected(**yaml.safe_load(HYPERPOD_SNIPPET), **section)
    assert f"spec: {named} set the same thing differently" in message


def test_discrete_sizes_both_ways_compare_as_sets_of_sizes() -> None:
    policy = {"minReplicas": 2, "maxReplicas": 8, "replicaDiscreteValues": [8, 2]}
    assert "replicas.discrete" in rejected(elasticPolicy=policy, replicas={"discrete": [2, 4]})
    same = parse_job(minimal(elasticPolicy=policy, replicas={"discrete": [2, 8]}))
    assert same.spec.replicas.discrete == [2, 8]


def test_unknown_elastic_policy_key_is_named_with_the_allowed_ones() -> None:
    message = rejected(elasticPolicy={"minReplicas": 2, "maxReplica": 4})
    assert "spec: elasticPolicy.maxReplica: not among the elasticPolicy fields" in message
    assert all(field in message for field in ELASTIC_POLICY_FIELDS)
    # resurge's own names are not HyperPod's: they go in their own sections.
    assert "elasticPolicy.min: not among" in rejected(elasticPolicy={"min": 2})


def test_elastic_policy_must_be_a_mapping() -> None:
    assert "elasticPolicy (HyperPod's) must be a mapping of minReplicas" in rejected(
        elasticPolicy=[2, 8]
    )


@pytest.mark.parametrize(
    ("policy", "named"),
    [
        (
            {"minReplicas": 4, "maxReplicas": 2},
            "elasticPolicy.maxReplicas (2) is below elasticPolicy.minReplicas (4)",
        ),
        ({"minReplicas": 0}, "elasticPolicy.minReplicas: Input should be greater than or equal"),
        ({"maxReplicas": -2}, "elasticPolicy.maxReplicas: Input should be greater than or equal"),
        ({"replicaIncrementStep": 0}, "elasticPolicy.replicaIncrementStep: Input should be"),
        ({"replicaDiscreteValues": []}, "elasticPolicy.replicaDiscreteValues: List should have"),
        ({"replicaDiscreteValues": [2, 0]}, "elasticPolicy.replicaDiscreteValues.1: Input"),
        (
            {"replicaDiscreteValues": [2, 4, 2]},
            "elasticPolicy.replicaDiscreteValues: lists [2] more",
        ),
        (
            {"gracefulShutdownTimeoutInSeconds": 0},
            "elasticPolicy.gracefulShutdownTimeoutInSeconds:",
        ),
        ({"faultyScaleDownTimeoutInSeconds": 0}, "elasticPolicy.faultyScaleDownTimeoutInSeconds:"),
        (
            {
                "minReplicas": 2,
                "maxReplicas": 8,
                "replicaIncrementStep": 2,
                "replicaDiscreteValues": [2, 4],
            },
            "elasticPolicy.replicaIncrementStep and elasticPolicy.replicaDiscreteValues exclude",
        ),
        (
            {"minReplicas": 2, "maxReplicas": 8, "replicaDiscreteValues": [1, 4, 16]},
            "elasticPolicy.replicaDiscreteValues sizes [1, 16] are outside "
            "[minReplicas=2, maxReplicas=8]",
        ),
    ],
)
def test_bad_elastic_policy_is_rejected_naming_the_field(
    policy: dict[str, object], named: str
) -> None:
    assert f"spec: {named}" in rejected(elasticPolicy=policy)


def test_a_conflict_across_the_two_sources_is_named_in_resurges_names() -> None:
    assert "spec.replicas: replicas.max (2) is below replicas.min (4)" in rejected(
        elasticPolicy={"minReplicas": 4}, replicas={"max": 2}
    )


@pytest.mark.parametrize(
    ("replicas", "named"),
    [
        ({"min": 0}, "spec.replicas.min: Input should be greater than or equal to 1"),
        ({"min": -1}, "spec.replicas.min: Input should be greater than or equal to 1"),
        ({"max": 0}, "spec.replicas.max: Input should be greater than or equal to 1"),
        ({"min": 1, "max": 4, "step": 0}, "spec.replicas.step: Input should be greater than"),
        ({"min": 1, "max": 4, "step": -2}, "spec.replicas.step: Input should be greater than"),
        ({"min": 1, "max": 4, "discrete": []}, "spec.replicas.discrete: List should have at"),
        ({"min": 1, "max": 4, "discrete": [0, 2]}, "spec.replicas.discrete.0: Input should be"),
        ({"min": 5, "max": 3}, "spec.replicas: replicas.max (3) is below replicas.min (5)"),
    ],
)
def test_bad_replicas_are_named(replicas: dict[str, object], named: str) -> None:
    assert named in rejected(replicas=replicas)


@pytest.mark.parametrize(
    ("replicas", "elastic", "within"),
    [
        ({}, False, {0: None, 1: 1, 5: 1}),
        ({"min": 2, "max": 2}, False, {1: None, 2: 2, 9: 2}),
        ({"min": 1, "max": 4}, True, {0: None, 3: 3, 9: 4}),
        ({"min": 2, "max": 9, "step": 3}, True, {4: 2, 7: 5, 9: 8}),  # 9 is not min + k*step
        ({"min": 2, "max": 4, "step": 4}, False, {4: 2}),  # one size only: not resizable
        ({"min": 2, "max": 16, "discrete": [2, 8, 16]}, True, {7: 2, 15: 8, 99: 16}),
    ],
)
def test_elastic_and_largest_size_within(
    replicas: dict[str, object], elastic: bool, within: dict[int, int | None]
) -> None:
    spec = parse_job(minimal(replicas=replicas)).spec.replicas
    assert spec.elastic is elastic
    assert {limit: spec.largest_size_within(limit) for limit in within} == within


def test_round_trip_by_alias_folds_elastic_policy_away() -> None:
    job = parse_job(
        minimal(
            **yaml.safe_load(HYPERPOD_SNIPPET),
            elastic={"cooldownSeconds": 15, "scaleUpSnoozeTimeInSeconds": 90},
        )
    )
    dumped = job.model_dump(by_alias=True)
    spec = dumped["spec"]
    assert "elasticPolicy" not in spec
    assert spec["replicas"] == {"min": 2, "max": 8, "step": 2, "discrete": None}
    assert spec["elastic"] == {
        "cooldownSeconds": 15.0,
        "scaleUpSnoozeSeconds": 90.0,
        "checkpointTimeoutSeconds": 120.0,
        "scalingTimeoutSeconds": 300.0,
    }
    assert spec["recovery"]["faultyScaleDownTimeoutSeconds"] == 45.0
    assert parse_job(dumped) == job
    assert parse_job(json.loads(job.model_dump_json(by_alias=True))) == job
    assert TrainingJob.model_validate(job.model_dump()) == job


def test_a_spec_without_elastic_settings_parses_as_before() -> None:
    document = minimal(replicas={"min": 2, "max": 8, "step": 2})
    job = parse_job(document)
    assert job.spec.replicas.allowed_sizes() == [2, 4, 6, 8]
    assert job.spec.elastic == ElasticSpec()


def test_parsing_leaves_the_document_as_it_was() -> None:
    document = minimal(**yaml.safe_load(HYPERPOD_SNIPPET))
    before = copy.deepcopy(document)
    parse_job(document)
    assert document == before


def test_hyperpods_scaling_timeout_in_spec_elastic_says_what_it_means() -> None:
    """Not "did you mean scalingTimeoutSeconds": that is another setting."""
    message = rejected(elastic={"scalingTimeoutInSeconds": 60})
    assert "spec.elastic: scalingTimeoutInSeconds: HyperPod waits this long" in message
    assert "did you mean" not in message
