"""Where a job's pods may go and what the cluster's other pods take: pure functions, no I/O.

resurge places worker groups itself, then kube-scheduler binds each pod; a placement
the scheduler would refuse leaves the pod Pending. So resurge counts what the
scheduler counts and offers a job only the nodes the scheduler would accept:

- :func:`in_use` is what every pod bound to a node and not finished requests of one
  resource (the accelerator), resurge's own worker-group pods left out (the job
  records count those), and its demand pods (:mod:`.demand`: they stand for a job
  that has no room yet). A pod's request of a resource is the larger of its
  containers' sum and its largest init container, plus its ``overhead``; a container
  that only limits an extended resource requests its limit ("Resource Management for
  Pods and Containers"; "Init containers", resource sharing).
- :func:`unfit_reason` says why a job's pod template may not go on a node, None when
  it may: its ``nodeSelector``, its required node affinity (terms ORed, expressions
  ANDed; ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``; ``matchFields``
  on ``metadata.name``) and the node's ``NoSchedule``/``NoExecute`` taints it does not
  tolerate ("Assigning Pods to Nodes"; "Taints and Tolerations"). The taints that
  stand for a state resurge reads apart (its own cordon taint, and the node
  controller's unschedulable, not-ready and unreachable taints) are not counted here:
  a cordoned or not-ready node is never a candidate anyway, and says so in its own
  words.

Left out: preferred affinity (a preference, never a refusal), inter-pod affinity and
topology spread, cpu and memory requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from resurge.cluster.kubernetes.objects import DEMAND_LABEL, GROUP_ANNOTATION, UNHEALTHY_TAINT

__all__ = ["STATE_TAINTS", "in_use", "pod_request", "unfit_reason"]

# Taints that mirror a node state resurge reads apart (a cordon, readiness).
STATE_TAINTS = frozenset(
    {
        UNHEALTHY_TAINT,
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
)
_FINISHED = ("Succeeded", "Failed")


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _objects(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _whole(value: object) -> int:
    """A whole quantity (``"8"``); 0 for anything else (an extended resource is whole)."""
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def _container(container: dict[str, Any], resource: str) -> int:
    resources = _mapping(container.get("resources"))
    requests = _mapping(resources.get("requests"))
    if resource in requests:
        return _whole(requests[resource])
    return _whole(_mapping(resources.get("limits")).get(resource, 0))


def pod_request(pod: dict[str, Any], resource: str) -> int:
    """How much of ``resource`` the scheduler counts ``pod`` as requesting."""
    spec = _mapping(pod.get("spec"))
    containers = sum(_container(c, resource) for c in _objects(spec.get("containers")))
    init = max((_container(c, resource) for c in _objects(spec.get("initContainers"))), default=0)
    return max(containers, init) + _whole(_mapping(spec.get("overhead")).get(resource, 0))


def in_use(pods: Iterable[dict[str, Any]], resource: str) -> dict[str, int]:
    """What the pods bound to each node and not finished request of ``resource``,
    resurge's worker-group and demand pods left out; nodes with none absent."""
    used: dict[str, int] = {}
    for pod in pods:
        spec = _mapping(pod.get("spec"))
        node = spec.get("nodeName")
        if not isinstance(node, str) or not node:
            continue
        if _mapping(pod.get("status")).get("phase") in _FINISHED:
            continue
        meta = _mapping(pod.get("metadata"))
        if GROUP_ANNOTATION in _mapping(meta.get("annotations")):
            continue
        if DEMAND_LABEL in _mapping(meta.get("labels")):
            continue
        amount = pod_request(pod, resource)
        if amount:
            used[node] = used.get(node, 0) + amount
    return used


def _tolerated(taint: Mapping[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        exists = (toleration.get("operator") or "Equal") == "Exists"
        if not key:
            if exists:
                return True
            continue
        if key == taint.get("key") and (
            exists or (toleration.get("value") or "") == (taint.get("value") or "")
        ):
            return True
    return False


def _requirement(expression: dict[str, Any], values_of: Mapping[str, str]) -> bool:
    key = str(expression.get("key"))
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "Exists":
        return key in values_of
    if operator == "DoesNotExist":
        return key not in values_of
    if operator == "NotIn":
        return values_of.get(key) not in values
    if key not in values_of:
        return False
    if operator == "In":
        return values_of[key] in values
    if operator in ("Gt", "Lt") and len(values) == 1:
        try:
            have, bound = int(values_of[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term(term: dict[str, Any], labels: Mapping[str, str], name: str) -> bool:
    expressions = _objects(term.get("matchExpressions"))
    fields = _objects(term.get("matchFields"))
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_requirement(e, labels) for e in expressions) and all(
        _requirement(f, {"metadata.name": name}) for f in fields
    )


def unfit_reason(
    template: object, name: str, labels: Mapping[str, str], taints: Iterable[Mapping[str, Any]]
) -> str | None:
    """Why a pod of ``template`` (a pod template: its ``spec``) may not be placed on
    node ``name`` with ``labels`` and ``taints``, in words; None when it may."""
    spec = _mapping(_mapping(template).get("spec"))
    for key, value in sorted(_mapping(spec.get("nodeSelector")).items()):
        if labels.get(key) != value:
            return f"nodeSelector {key}={value} (node has {key}={labels.get(key, '<none>')})"
    required = _mapping(
        _mapping(_mapping(spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    terms = _objects(required.get("nodeSelectorTerms"))
    if required and not any(_term(term, labels, name) for term in terms):
        return "required node affinity matches no label set of the node"
    tolerations = _objects(spec.get("tolerations"))
    for taint in taints:
        if taint.get("key") in STATE_TAINTS or taint.get("effect") not in (
            "NoSchedule",
            "NoExecute",
        ):
            continue
        if not _tolerated(taint, tolerations):
            shown = (
                f"{taint.get('key')}={taint.get('value')}"
                if taint.get("value")
                else taint.get("key")
            )
            return f"taint {shown}:{taint.get('effect')} not tolerated"
    return None
