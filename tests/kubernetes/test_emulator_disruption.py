"""The emulator's PodDisruptionBudgets and pods/eviction, through the official client over
HTTP, answer as a real API server does (tests/kubernetes/disruption.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, cast

import kubernetes.client as client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.kubernetes.conftest import KubeApi

NS = "default"


def body(name: str, **spec: Any) -> dict[str, Any]:
    """A budget over the pods labelled ``app=a``."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "a"}}, **spec},
    }


def eviction(name: str) -> client.V1Eviction:
    return client.V1Eviction(
        api_version="policy/v1", kind="Eviction", metadata=client.V1ObjectMeta(name=name)
    )


def running_pod(
    api: KubeApi, name: str, ready: bool = True, owner: dict[str, Any] | None = None
) -> None:
    """A pod labelled ``app=a``, Running, Ready or not (as a kubelet reports it)."""
    meta: dict[str, Any] = {"name": name, "labels": {"app": "a"}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    api.create(
        "pods",
        {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        NS,
    )
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    api.patch_status("pods", name, {"phase": "Running", "conditions": [condition]}, NS)


def evict(api: KubeApi, name: str) -> int:
    """POST the pod's eviction; the HTTP status (201: evicted)."""
    core = client.CoreV1Api(api.api_client())
    try:
        core.create_namespaced_pod_eviction(name, NS, eviction(name))
    except ApiException as error:
        return int(error.status)
    return 201


def refusal(api: KubeApi, name: str) -> dict[str, Any]:
    core = client.CoreV1Api(api.api_client())
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod_eviction(name, NS, eviction(name))
    found: dict[str, Any] = json.loads(caught.value.body or "{}")
    return found


def pods(api: KubeApi) -> list[str]:
    return sorted(p["metadata"]["name"] for p in api.objects("pods", NS))


def test_a_budget_that_allows_no_disruption_refuses_evictions_with_429(
    kube_api_thread: KubeApi,
) -> None:
    api = kube_api_thread
    policy = client.PolicyV1Api(api.api_client())
    policy.create_namespaced_pod_disruption_budget(NS, cast(Any, body)("b", minAvailable=2))
    running_pod(api, "p0")
    running_pod(api, "p1")

    status = refusal(api, "p0")

    assert status["code"] == 429 and status["reason"] == "TooManyRequests", status
    assert status["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert status["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget b needs 2 healthy pods and has 2 currently",
        }
    ]
    assert pods(api) == ["p0", "p1"]
    assert api.requests().get(("create", "pods/eviction")) == 1


def test_an_eviction_the_budget_allows_deletes_the_pod_and_the_next_is_refused(
    kube_api_thread: KubeApi,
) -> None:
    api = kube_api_thread
    api.create("poddisruptionbudgets", body("b", minAvailable=1), NS)
    running_pod(api, "p0")
    running_pod(api, "p1")

    assert evict(api, "p0") == 201
    assert pods(api) == ["p1"]
    assert evict(api, "p1") == 429
    assert evict(api, "p0") == 404  # gone: what kubectl drain takes as done


def test_pods_no_budget_selects_pending_pods_and_unready_ones_under_always_allow_go(
    kube_api_thread: KubeApi,
) -> None:
    api = kube_api_thread
    api.create("poddisruptionbudgets", body("b", minAvailable=5), NS)
    running_pod(api, "unready", ready=False)
    api.create(
        "pods",
        {"metadata": {"name": "other"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        NS,
    )
    api.create(
        "pods",
        {
            "metadata": {"name": "pending", "labels": {"app": "a"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
        NS,
    )

    assert evict(api, "other") == 201  # no budget selects it
    assert evict(api, "pending") == 201  # a Pending pod goes whatever its budget
    assert evict(api, "unready") == 429  # IfHealthyBudget, and the budget lacks pods
    always = {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}}
    api.call(lambda em: em.patch_object("poddisruptionbudgets", "b", always, NS))
    assert evict(api, "unready") == 201
    assert pods(api) == []


def test_max_unavailable_over_pods_of_a_controller_without_scale_allows_nothing(
    kube_api_thread: KubeApi,
) -> None:
    """The disruption controller reads ``maxUnavailable`` against the owner's scale
    subresource; a TrainingJob has none, so it fails safe: nothing may be evicted, even
    with ``maxUnavailable: 1`` (why resurge's budgets use ``minAvailable``)."""
    api = kube_api_thread
    job = api.create(
        "trainingjobs",
        {
            "apiVersion": "resurge.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "tj"},
            "spec": {"command": ["python", "train.py"], "replicas": {"min": 1, "max": 2}},
        },
        NS,
    )
    owner = {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "name": "tj",
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    api.create("poddisruptionbudgets", body("b", maxUnavailable=1), NS)
    running_pod(api, "p0", owner=owner)
    running_pod(api, "p1", owner=owner)

    assert evict(api, "p0") == 429
    api.delete("poddisruptionbudgets", "b", NS)
    api.create("poddisruptionbudgets", body("b", minAvailable=1), NS)
    assert evict(api, "p0") == 201


def test_a_pod_with_two_budgets_cannot_be_evicted(kube_api_thread: KubeApi) -> None:
    api = kube_api_thread
    api.create("poddisruptionbudgets", body("one", minAvailable=0), NS)
    api.create("poddisruptionbudgets", body("two", minAvailable=0), NS)
    running_pod(api, "p0")

    status = refusal(api, "p0")

    assert status["code"] == 500 and "more than one PodDisruptionBudget" in status["message"]
    assert pods(api) == ["p0"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"minAvailable": 1, "maxUnavailable": 0}, "minAvailable and maxUnavailable cannot be"),
        ({"minAvailable": -1}, "spec.minAvailable: Invalid value: -1: must be greater than"),
        ({"maxUnavailable": "150%"}, 'spec.maxUnavailable: Invalid value: "150%": must not be'),
        ({"unhealthyPodEvictionPolicy": "Never"}, 'Unsupported value: "Never"'),
    ],
)
def test_an_invalid_budget_is_refused_with_422(
    kube_api_thread: KubeApi, spec: dict[str, Any], message: str
) -> None:
    policy = client.PolicyV1Api(kube_api_thread.api_client())
    with pytest.raises(ApiException) as caught:
        policy.create_namespaced_pod_disruption_budget(NS, cast(Any, body)("b", **spec))
    assert caught.value.status == 422
    assert message in json.loads(caught.value.body or "{}")["message"]


def test_the_eviction_subresource_takes_only_a_create_of_the_pods_own_eviction(
    kube_api_thread: KubeApi,
) -> None:
    api = kube_api_thread
    running_pod(api, "p0")
    core = client.CoreV1Api(api.api_client())
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod_eviction("p0", NS, eviction("p1"))
    assert caught.value.status == 400
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{api.url}/api/v1/namespaces/{NS}/pods/p0/eviction")
    assert refused.value.code == 405
    with urllib.request.urlopen(f"{api.url}/api/v1/") as answer:
        resources = json.load(answer)
    [listed] = [r for r in resources["resources"] if r["name"] == "pods/eviction"]
    assert (listed["group"], listed["version"], listed["kind"], listed["verbs"]) == (
        "policy", "v1", "Eviction", ["create"],
    )  # fmt: skip
    assert pods(api) == ["p0"]
