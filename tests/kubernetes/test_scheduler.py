"""The process kubelet's scheduler filters (scheduler.py), rule by rule, each against the
Kubernetes documentation it follows: the stand-in must refuse what kube-scheduler
refuses, or a test through it would pass where a cluster leaves the pod Pending."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.kubernetes.scheduler import feasibility, pod_requests, quantity, unschedulable_message

GPU = "nvidia.com/gpu"


def node(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "n", "labels": labels or {}},
        "spec": spec,
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "3", GPU: "2"}},
    }


def pod(uid: str = "p", node_name: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "c"}], **spec}
    if node_name:
        body["nodeName"] = node_name
    return {"metadata": {"uid": uid}, "spec": body, "status": {"phase": "Running"}}


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("500m", Decimal("0.5")), ("64Gi", 64 * 2**30), ("1G", 10**9), ("1e3", 1000)],
)
def test_quantities(text: str, value: Decimal | int) -> None:
    """The "Quantity" reference of the Kubernetes API: decimal and binary suffixes,
    milli, and exponents."""
    assert quantity(text) == value


def test_a_pods_request_is_its_containers_sum_or_largest_init_container_plus_overhead() -> None:
    """ "Init containers" (kubernetes.io/docs/concepts/workloads/pods/init-containers/,
    Resource sharing within containers): the effective request is the larger of the
    containers' sum and the largest init container; Pod Overhead adds to it; a container
    that only limits a resource requests its limit."""
    body = pod(
        containers=[
            {"resources": {"requests": {"cpu": "1"}, "limits": {GPU: "1"}}},
            {"resources": {"requests": {"cpu": "500m"}}},
        ],
        initContainers=[{"resources": {"requests": {"cpu": "2"}}}],
        overhead={"cpu": "100m"},
    )
    assert pod_requests(body) == {"cpu": Decimal("2.1"), GPU: 1, "pods": 1}


def test_every_pod_bound_to_the_node_counts_and_finished_ones_do_not() -> None:
    """NodeResourcesFit ("Resource Management for Pods and Containers"): the requests of
    the pods on the node plus the new one within allocatable, one reason per resource."""
    gpu = {"resources": {"limits": {GPU: "1"}}}
    others = [
        pod("a", "n", containers=[gpu]),
        {**pod("b", "n", containers=[gpu]), "status": {"phase": "Succeeded"}},
        pod("c", "m", containers=[gpu]),
    ]
    wanting = pod(containers=[{"resources": {"limits": {GPU: "1"}, "requests": {"cpu": "4"}}}])
    assert feasibility(wanting, node(), others) == []
    others.append(pod("d", "n", containers=[{"resources": {"requests": {"cpu": "1"}}}]))
    assert feasibility(wanting, node(), others) == ["Insufficient cpu"]
    others.append(pod("e", "n", containers=[gpu]))
    assert feasibility(wanting, node(), others) == [
        "Insufficient cpu",
        "Insufficient nvidia.com/gpu",
        "Too many pods",
    ]


def test_node_affinity_operators_terms_and_selector() -> None:
    """ "Assigning Pods to Nodes" (kubernetes.io/docs/concepts/scheduling-eviction/
    assign-pod-node/): Gt and Lt compare integers, NotIn and DoesNotExist match a
    missing label, terms are ORed and an empty term matches nothing; nodeSelector and
    affinity must both hold."""

    def required(*terms: dict[str, Any]) -> dict[str, Any]:
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }

    labels = {"gen": "9", "pool": "train"}
    fits = pod(
        affinity=required({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["8"]}]})
    )
    assert feasibility(fits, node(labels), []) == []
    missing = pod(
        affinity=required(
            {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}
        )
    )
    assert feasibility(missing, node(labels), []) == []
    empty_or_named = pod(
        affinity=required(
            {}, {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
        )
    )
    assert feasibility(empty_or_named, node(labels), []) == []
    assert feasibility(pod(affinity=required({})), node(labels), []) == [
        "node(s) didn't match Pod's node affinity/selector"
    ]
    both = pod(
        nodeSelector={"pool": "serve"},
        affinity=required({"matchExpressions": [{"key": "gen", "operator": "Exists"}]}),
    )
    assert feasibility(both, node(labels), []) == [
        "node(s) didn't match Pod's node affinity/selector"
    ]


def test_taints_and_tolerations() -> None:
    """ "Taints and Tolerations" (kubernetes.io/docs/concepts/scheduling-eviction/
    taint-and-toleration/): Equal is the default operator, an empty effect matches
    every effect, an empty key with Exists matches every taint; PreferNoSchedule never
    refuses; an unschedulable node takes only pods tolerating its taint."""
    tainted = node(
        taints=[
            {"key": "team", "value": "a", "effect": "NoExecute"},
            {"key": "soft", "effect": "PreferNoSchedule"},
        ]
    )
    assert feasibility(pod(), tainted, []) == ["node(s) had untolerated taint {team: a}"]
    assert feasibility(pod(tolerations=[{"key": "team", "value": "a"}]), tainted, []) == []
    assert feasibility(pod(tolerations=[{"operator": "Exists"}]), tainted, []) == []
    assert feasibility(pod(tolerations=[{"key": "team", "value": "b"}]), tainted, []) != []
    cordoned = node(unschedulable=True)
    assert feasibility(pod(), cordoned, []) == ["node(s) were unschedulable"]
    tolerant = pod(
        tolerations=[
            {
                "key": "node.kubernetes.io/unschedulable",
                "operator": "Exists",
                "effect": "NoSchedule",
            }
        ]
    )
    assert feasibility(tolerant, cordoned, []) == []


def test_the_message_counts_reasons_as_kube_scheduler_does() -> None:
    """kube-scheduler's FitError.Error (pkg/scheduler/framework/types.go): "0/N nodes are
    available: " and each "count reason", the strings sorted, joined by ", "."""
    reasons = [
        ["Insufficient nvidia.com/gpu"],
        ["node(s) were unschedulable"],
        ["Insufficient nvidia.com/gpu"],
    ]
    assert unschedulable_message(3, reasons) == (
        "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient nvidia.com/gpu."
    )
