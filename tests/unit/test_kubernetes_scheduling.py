"""Where a job's pods may go (resurge.cluster.kubernetes.scheduling) and how resurge's pin
joins a template's node affinity (objects.pod_manifest): what kube-scheduler would
accept, so a placement never leaves a pod Pending."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from resurge.cluster import WorkerGroupSpec
from resurge.cluster.kubernetes.objects import node_info, pod_manifest
from resurge.cluster.kubernetes.scheduling import in_use, pod_request, unfit_reason

GPU = "nvidia.com/gpu"
HEALTHY = "sagemaker.amazonaws.com/node-health-status"
COMPUTE = "sagemaker.amazonaws.com/compute-type"

# A HyperPod manifest's node affinity and pod anti-affinity
# (tests/data/hyperpod/llama3_1_8b-fsdp-hpto.yaml), with a preference added.
HYPERPOD_AFFINITY: dict[str, Any] = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {"job-name": "llama"}},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    },
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": HEALTHY, "operator": "In", "values": ["Schedulable"]},
                        {"key": COMPUTE, "operator": "In", "values": ["ml.p5.48xlarge"]},
                    ]
                },
                {"matchExpressions": [{"key": "spare-pool", "operator": "Exists"}]},
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "preference": {
                    "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                },
            }
        ],
    },
}


def template(**spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "main"}], **spec}}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    found: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        found["values"] = list(values)
    return found


LABELS = {"pool": "train", "gen": "9", HEALTHY: "Schedulable"}


@pytest.mark.parametrize(
    ("expression", "fits"),
    [
        (expr("pool", "In", "train", "x"), True),
        (expr("pool", "In", "serve"), False),
        (expr("absent", "In", "x"), False),
        (expr("pool", "NotIn", "serve"), True),
        (expr("pool", "NotIn", "train"), False),
        (expr("absent", "NotIn", "x"), True),
        (expr("pool", "Exists"), True),
        (expr("absent", "Exists"), False),
        (expr("absent", "DoesNotExist"), True),
        (expr("pool", "DoesNotExist"), False),
        (expr("gen", "Gt", "8"), True),
        (expr("gen", "Gt", "9"), False),
        (expr("gen", "Lt", "10"), True),
        (expr("gen", "Lt", "9"), False),
        (expr("pool", "Gt", "1"), False),  # not a number: no match
        (expr("absent", "Lt", "1"), False),
    ],
)
def test_every_node_affinity_operator(expression: dict[str, Any], fits: bool) -> None:
    why = unfit_reason(
        template(affinity=affinity({"matchExpressions": [expression]})), "n", LABELS, []
    )
    assert (why is None) is fits


def test_terms_are_ored_expressions_anded_and_an_empty_term_matches_nothing() -> None:
    both = {"matchExpressions": [expr("pool", "In", "train"), expr("gen", "In", "8")]}
    assert unfit_reason(template(affinity=affinity(both)), "n", LABELS, []) is not None
    either = affinity(
        {"matchExpressions": [expr("gen", "In", "8")]},
        {"matchExpressions": [expr("pool", "Exists")]},
    )
    assert unfit_reason(template(affinity=either), "n", LABELS, []) is None
    assert unfit_reason(template(affinity=affinity({})), "n", LABELS, []) is not None
    named = affinity({"matchFields": [expr("metadata.name", "In", "n")]})
    assert unfit_reason(template(affinity=named), "n", LABELS, []) is None
    assert unfit_reason(template(affinity=named), "m", LABELS, []) is not None


def test_node_selector_and_affinity_must_both_hold() -> None:
    selected = template(
        nodeSelector={"pool": "train"},
        affinity=affinity({"matchExpressions": [expr("gen", "In", "8")]}),
    )
    assert (
        unfit_reason(selected, "n", LABELS, [])
        == "required node affinity matches no label set of the node"
    )
    assert unfit_reason(template(nodeSelector={"pool": "serve"}), "n", LABELS, []) == (
        "nodeSelector pool=serve (node has pool=train)"
    )
    assert unfit_reason(template(nodeSelector={"pool": "train"}), "n", LABELS, []) is None


@pytest.mark.parametrize(
    ("toleration", "fits"),
    [
        ({"key": "team", "operator": "Equal", "value": "vision"}, True),
        ({"key": "team", "value": "vision", "effect": "NoSchedule"}, True),
        ({"key": "team", "value": "vision", "effect": "NoExecute"}, False),
        ({"key": "team", "value": "nlp"}, False),
        ({"key": "team", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),
        ({"key": "other", "operator": "Exists"}, False),
        (None, False),
    ],
)
def test_a_taint_keeps_away_pods_that_do_not_tolerate_it(
    toleration: dict[str, Any] | None, fits: bool
) -> None:
    taint = {"key": "team", "value": "vision", "effect": "NoSchedule"}
    spec = template(tolerations=[toleration] if toleration else [])
    why = unfit_reason(spec, "n", LABELS, [taint])
    assert (why is None) is fits
    if not fits:
        assert why == "taint team=vision:NoSchedule not tolerated"


def test_taints_for_states_resurge_reads_apart_and_soft_ones_are_not_counted() -> None:
    taints = [
        {"key": "resurge.dev/unhealthy", "value": "true", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
        {"key": "soft", "effect": "PreferNoSchedule"},
    ]
    assert unfit_reason(template(), "n", LABELS, taints) is None


def _pod(node: str | None, gpus: int, phase: str = "Running", **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"resources": {"limits": {GPU: str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": extra.pop("metadata", {}),
        "spec": {**spec, **extra},
        "status": {"phase": phase},
    }


def test_what_other_pods_bound_to_a_node_request_counts_against_it() -> None:
    pods = [
        _pod("a", 2),
        _pod("a", 1, phase="Pending"),
        _pod("a", 4, phase="Succeeded"),
        _pod("b", 8, phase="Failed"),
        _pod(None, 8),  # not bound: takes nothing yet
        _pod("b", 3, metadata={"annotations": {"resurge.dev/worker-group": "{}"}}),
        _pod("c", 1, initContainers=[{"resources": {"requests": {GPU: "4"}}}], overhead={GPU: "1"}),
    ]
    assert in_use(pods, GPU) == {"a": 3, "c": 5}
    assert in_use(pods, "amd.com/gpu") == {}
    # requests win over limits; containers add up
    two = {
        "spec": {"containers": [{"resources": {"requests": {GPU: "1"}, "limits": {GPU: "2"}}}] * 2}
    }
    assert pod_request(two, GPU) == 2


def test_node_info_carries_the_nodes_taints() -> None:
    node = {
        "metadata": {"name": "n", "labels": {"pool": "train"}},
        "spec": {
            "taints": [
                {"key": "team", "value": "vision", "effect": "NoSchedule"},
                {"key": "x", "effect": "NoExecute"},
            ]
        },
        "status": {"allocatable": {GPU: "8"}},
    }
    info = node_info(node)
    assert [(t.key, t.value, t.effect) for t in info.taints] == [
        ("team", "vision", "NoSchedule"),
        ("x", "", "NoExecute"),
    ]


GROUP = WorkerGroupSpec(job="llama", replica=0, node="gpu-7", nproc=8, command=["python"])


def _job(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "llama", "namespace": "default", "uid": "u"},
        "spec": {"command": ["python"], "template": {"spec": pod_spec}},
    }


def test_the_pin_joins_each_of_the_templates_required_terms_and_keeps_the_rest() -> None:
    """A HyperPod manifest's node-health-status and compute-type terms stay: the pin is
    ANDed into each term (terms stay ORed); preferred terms and pod anti-affinity stay."""
    written = copy.deepcopy(HYPERPOD_AFFINITY)
    pod = pod_manifest(GROUP, _job({"containers": [{}], "affinity": written}), {}, "img")
    assert written == HYPERPOD_AFFINITY, "the template is not changed"
    got = pod["spec"]["affinity"]
    pin = {"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}
    terms = got["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    wanted = HYPERPOD_AFFINITY["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [{**term, "matchFields": [pin]} for term in wanted]
    assert got["podAntiAffinity"] == HYPERPOD_AFFINITY["podAntiAffinity"]
    assert (
        got["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        == (HYPERPOD_AFFINITY["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"])
    )
    # The node the pod is pinned to must still match the template: on it, each term holds.
    labels = {HEALTHY: "Schedulable", COMPUTE: "ml.p5.48xlarge"}
    assert unfit_reason(pod, "gpu-7", labels, []) is None
    assert unfit_reason(pod, "gpu-8", labels, []) is not None
    assert (
        unfit_reason(pod, "gpu-7", {HEALTHY: "Unschedulable", COMPUTE: "ml.p5.48xlarge"}, [])
        is not None
    )


def test_without_a_template_affinity_the_pin_is_the_one_term() -> None:
    pod = pod_manifest(
        GROUP, _job({"containers": [{}], "nodeSelector": {"pool": "train"}}), {}, "img"
    )
    assert pod["spec"]["nodeSelector"] == {"pool": "train"}
    assert pod["spec"]["affinity"] == affinity(
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}
    )
