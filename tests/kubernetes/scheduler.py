"""The scheduler's filters, as the process kubelet (kubelet.py) applies them: which node
a pod may be bound to, and kube-scheduler's words when none fits. Pure functions on the
JSON objects; written from the Kubernetes documentation, independently of resurge's
own matcher (shared/resurge/cluster/kubernetes/scheduling.py), so a test through the
stand-in never trusts the code it tests.

A node is feasible for a pod when each filter passes, in kube-scheduler's default
order (the first that fails names the node's reason, as ``RunFilterPlugins`` stops at
the first failure):

- **NodeUnschedulable**: ``spec.unschedulable`` unless the pod tolerates
  ``node.kubernetes.io/unschedulable:NoSchedule``;
- **TaintToleration**: every ``NoSchedule``/``NoExecute`` taint tolerated ("Taints and
  Tolerations", kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/:
  same key, or an empty key with ``Exists``; ``Exists`` or equal values (``Equal`` is
  the default operator); an empty effect matches every effect);
- **NodeAffinity**: ``nodeSelector`` (every pair a label of the node) and required node
  affinity both hold ("Assigning Pods to Nodes",
  kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/: terms ORed,
  expressions of one term ANDed; ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``,
  ``Lt``; ``matchFields`` on ``metadata.name``; an empty term matches no node, as
  the NodeSelectorTerm API reference says);
- **NodeResourcesFit**: for each resource the pod requests, the requests of every pod
  bound to the node and not finished, plus this pod's, at most the node's allocatable
  ("Resource Management for Pods and Containers",
  kubernetes.io/docs/concepts/configuration/manage-resources-containers/). A pod's
  request is the larger of its containers' sum and its largest init container ("Init
  containers", kubernetes.io/docs/concepts/workloads/pods/init-containers/, "Resource
  sharing within containers"), plus ``spec.overhead``; a container's request of a
  resource it only limits is its limit (extended resources must have both equal); the
  pod count is checked against allocatable ``pods``.

What it leaves out: preferred affinity and scoring (it takes the first feasible node by
name), inter-pod affinity and topology spread, host ports, volumes, sidecar init
containers (``restartPolicy: Always``) counted as regular ones, preemption and
priority, ``PreferNoSchedule``, and the DefaultTolerationSeconds tolerations.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "feasibility",
    "pod_requests",
    "quantity",
    "unschedulable_message",
]

_SUFFIXES: dict[str, Decimal | int] = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]*)$")


def quantity(text: object) -> Decimal:
    """A resource quantity (``"500m"``, ``"64Gi"``, ``"2"``, ``"1e3"``) as a number; the
    "Quantity" reference of the Kubernetes API. Raises ValueError on anything else."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = match.groups()
    try:
        value = Decimal(number)
        if suffix[:1] in ("e", "E"):
            return value * Decimal(10) ** int(suffix[1:])
        return value * Decimal(_SUFFIXES[suffix])
    except (KeyError, InvalidOperation) as error:
        raise ValueError(f"not a quantity: {text!r}") from error


def _container_requests(container: dict[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: quantity(value) for name, value in merged.items()}


def pod_requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """What the scheduler counts ``pod`` as requesting (the module's rules), ``pods``: 1."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, value in _container_requests(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in spec.get("initContainers") or []:
        for name, value in _container_requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    for name, value in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + quantity(value)
    total["pods"] = Decimal(1)
    return total


def _tolerates(taint: dict[str, Any], tolerations: Iterable[dict[str, Any]]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        operator = toleration.get("operator") or "Equal"
        key = toleration.get("key") or ""
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression(expr: dict[str, Any], values_of: dict[str, str]) -> bool:
    key, operator = expr.get("key"), expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    present = key in values_of
    value = values_of.get(str(key))
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(str(value)), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term(term: dict[str, Any], labels: dict[str, str], name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_expression(e, labels) for e in expressions) and all(
        _expression(f, {"metadata.name": name}) for f in fields
    )


def _affinity_matches(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    name = str(meta.get("name"))
    return any(_term(term, labels, name) for term in required.get("nodeSelectorTerms") or [])


def _running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def feasibility(
    pod: dict[str, Any], node: dict[str, Any], pods: Iterable[dict[str, Any]]
) -> list[str]:
    """Why ``pod`` may not be bound to ``node`` (kube-scheduler's reasons, one per
    insufficient resource); empty when it may. ``pods``: every pod in the cluster; those
    bound to ``node`` and not finished, other than ``pod``, count against it."""
    spec = node.get("spec") or {}
    tolerations = list((pod.get("spec") or {}).get("tolerations") or [])
    unschedulable = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    if spec.get("unschedulable") and not _tolerates(unschedulable, tolerations):
        return ["node(s) were unschedulable"]
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
            taint, tolerations
        ):
            shown = f"{taint.get('key')}: {taint.get('value')}" if taint.get("value") else ""
            return [f"node(s) had untolerated taint {{{shown or taint.get('key')}}}"]
    if not _affinity_matches(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    name = (node.get("metadata") or {}).get("name")
    uid = (pod.get("metadata") or {}).get("uid")
    used: dict[str, Decimal] = {}
    for other in pods:
        if (other.get("spec") or {}).get("nodeName") != name or not _running(other):
            continue
        if (other.get("metadata") or {}).get("uid") == uid:
            continue
        for resource, amount in pod_requests(other).items():
            used[resource] = used.get(resource, Decimal(0)) + amount
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    reasons = []
    for resource, amount in sorted(pod_requests(pod).items()):
        if amount <= 0:
            continue
        have = quantity(allocatable[resource]) if resource in allocatable else Decimal(0)
        if used.get(resource, Decimal(0)) + amount > have:
            reasons.append("Too many pods" if resource == "pods" else f"Insufficient {resource}")
    return reasons


def unschedulable_message(nodes: int, reasons: Iterable[list[str]]) -> str:
    """kube-scheduler's FailedScheduling message: ``0/3 nodes are available: 1 Insufficient
    nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector.``, each reason
    with its count, the "count reason" strings sorted (its ``FitError.Error``); the
    preemption part that follows is left out."""
    counts = Counter(reason for node in reasons for reason in node)
    words = ", ".join(sorted(f"{count} {reason}" for reason, count in counts.items()))
    return f"0/{nodes} nodes are available: {words}."
