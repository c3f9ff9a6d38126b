"""How a job's pods wait for its checkpoint when others evict them: its
PodDisruptionBudget and its pods' toleration of NoExecute taints (pure functions)."""

from __future__ import annotations

from typing import Any

import pytest

from resurge.cluster import WorkerGroupSpec
from resurge.cluster.kubernetes.disruption import (
    NOTICE_SECONDS,
    checkpoint_deadline,
    disruption_budget,
    no_execute_seconds,
)
from resurge.cluster.kubernetes.objects import owner_reference, pod_manifest

TRAINING_JOB: dict[str, Any] = {
    "apiVersion": "resurge.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "llama", "namespace": "nlp", "uid": "u-1"},
    "spec": {"command": ["python", "train.py"]},
}
GROUP = WorkerGroupSpec(job="nlp/llama", replica=0, node="gpu-1", nproc=1, command=["python"])


def test_the_budget_allows_no_eviction_of_the_jobs_worker_pods_and_goes_with_it() -> None:
    selector = {"matchLabels": {"resurge.dev/job": "llama"}}
    budget = disruption_budget(TRAINING_JOB, selector, 3, owner_reference(TRAINING_JOB))
    assert budget == {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": "llama",
            "labels": {"resurge.dev/job": "llama"},
            "ownerReferences": [owner_reference(TRAINING_JOB)],
        },
        "spec": {
            # minAvailable, an integer: maxUnavailable needs a scale subresource
            "minAvailable": 3,
            "selector": selector,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


@pytest.mark.parametrize(
    ("spec", "seconds"),
    [
        ({}, 30.0),  # elastic.checkpointTimeoutSeconds' default
        ({"elastic": {"checkpointTimeoutSeconds": 45.5}}, 45.5),
        ({"elastic": {"gracefulShutdownTimeoutInSeconds": 90}}, 90.0),
        ({"elasticPolicy": {"gracefulShutdownTimeoutInSeconds": 120}}, 120.0),  # HyperPod's
        ({"elastic": {"checkpointTimeoutSeconds": -1}}, 30.0),  # refused at submission
        ({"elastic": "soon"}, 30.0),
        (None, 30.0),
    ],
)
def test_the_checkpoint_deadline_is_the_jobs_elastic_checkpoint_timeout(
    spec: dict[str, Any] | None, seconds: float
) -> None:
    assert checkpoint_deadline(spec) == seconds


def test_pods_tolerate_no_execute_taints_for_the_deadline_and_the_notice_after_the_templates() -> (
    None
):
    job = {
        **TRAINING_JOB,
        "spec": {
            **TRAINING_JOB["spec"],
            "elastic": {"checkpointTimeoutSeconds": 45.5},
            "template": {
                "spec": {
                    "tolerations": [
                        {"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}
                    ]
                }
            },
        },
    }
    tolerations = pod_manifest(GROUP, job, {}, "img")["spec"]["tolerations"]
    assert no_execute_seconds(job["spec"]) == 46 + NOTICE_SECONDS
    assert tolerations == [
        # the template's first: the taint manager takes the first that tolerates a taint
        {"key": "maintenance", "operator": "Exists", "effect": "NoExecute"},
        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 46 + NOTICE_SECONDS},
    ]
    # a job without a TrainingJob (its default deadline)
    [default] = pod_manifest(GROUP, None, {}, "img")["spec"]["tolerations"]
    assert default["tolerationSeconds"] == 30 + NOTICE_SECONDS
