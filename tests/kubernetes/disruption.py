"""PodDisruptionBudgets and the Eviction API as a real API server applies them, for the
emulator (``ClusterEmulator`` serves ``policy/v1`` poddisruptionbudgets and
``POST .../pods/NAME/eviction`` with these).

- :func:`budget_errors`: what the apiserver's validation refuses of a budget's spec (both
  ``minAvailable`` and ``maxUnavailable``, a negative count, a percentage over 100%, an
  ``unhealthyPodEvictionPolicy`` other than ``IfHealthyBudget`` and ``AlwaysAllow``).
- :func:`selects`: a policy/v1 budget's ``selector`` (``matchLabels``, ``matchExpressions``;
  no selector selects nothing, ``{}`` every pod of its namespace).
- :func:`budget_status`: what the disruption controller would write as the budget's status
  (pkg/controller/disruption): the healthy pods are the selected pods that are Ready and
  not being deleted; an integer ``minAvailable`` is the pods desired healthy out of the
  selected ones; ``maxUnavailable`` and percentages need the expected count, read from
  the scale of each selected pod's controller, and where one has no scale subresource
  (a TrainingJob) the controller fails safe: no disruption allowed. Pods without a
  controller are left out of that count.
- :func:`eviction_refusal`: the eviction subresource's decision (pkg/registry/core/pod/
  storage/eviction.go): a pod Pending, finished or being deleted goes whatever its
  budgets; more than one budget is a 500; a pod that is not Ready goes under
  ``AlwaysAllow``, or under ``IfHealthyBudget`` while the budget has its healthy pods;
  else the budget must allow a disruption, or the answer is 429 TooManyRequests with a
  ``DisruptionBudget`` cause.

Simplified: the status is worked out at each eviction from the pods as they are, not
written by a controller (no ``status`` is stored on the budget, no ``disruptedPods`` map:
the emulator deletes an evicted pod at once, so the next count already misses it); no
``dryRun``; the eviction's ``deleteOptions`` are applied as a delete's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tests.kubernetes.admission import FieldError

__all__ = ["budget_errors", "budget_status", "eviction_refusal", "selects"]

POLICIES = ("IfHealthyBudget", "AlwaysAllow")
# The scale of a pod's controller (by its owner reference and namespace); None where the
# owner has no scale subresource or is not there.
ScaleOf = Callable[[Mapping[str, Any], str], int | None]


def _percent(value: Any) -> int | None:
    """The number of a ``"N%"`` value; None for anything else."""
    if isinstance(value, str) and re.fullmatch(r"\d+%", value):
        return int(value[:-1])
    return None


def budget_errors(spec: Mapping[str, Any]) -> list[FieldError]:
    """What the apiserver's validation of a PodDisruptionBudget's spec refuses here."""
    errors: list[FieldError] = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        both = "minAvailable and maxUnavailable cannot be both set"
        errors.append(FieldError("spec", "FieldValueInvalid", dict(spec), both))
    for name in ("minAvailable", "maxUnavailable"):
        value = spec.get(name)
        percent = _percent(value)
        if value is None:
            detail = ""
        elif isinstance(value, bool) or not isinstance(value, int | str):
            detail = "must be an integer or percentage (e.g '5%')"
        elif isinstance(value, int):
            detail = "must be greater than or equal to 0" if value < 0 else ""
        elif percent is None:
            detail = (
                "a valid percent string must be a numeric string followed by an ending '%' "
                "(e.g. '1%',  or '93%')"
            )
        else:
            detail = "must not be greater than 100%" if percent > 100 else ""
        if detail:
            errors.append(FieldError(f"spec.{name}", "FieldValueInvalid", value, detail))
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in POLICIES:
        supported = 'supported values: "AlwaysAllow", "IfHealthyBudget"'
        where = "spec.unhealthyPodEvictionPolicy"
        errors.append(FieldError(where, "FieldValueNotSupported", policy, supported))
    return errors


def _expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = str(expr.get("key")), expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False


def selects(budget: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``budget`` governs ``pod`` (the same namespace, its selector matched)."""
    meta, pod_meta = budget.get("metadata") or {}, pod.get("metadata") or {}
    if meta.get("namespace") != pod_meta.get("namespace"):
        return False
    selector = (budget.get("spec") or {}).get("selector")
    if selector is None:
        return False
    labels = pod_meta.get("labels") or {}
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()) and all(
        _expression(e, labels) for e in selector.get("matchExpressions") or []
    )


def ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _healthy(pod: Mapping[str, Any]) -> bool:
    return ready(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp")


def _scaled(value: Any, total: int, round_up: bool) -> int:
    percent = _percent(value)
    if percent is None:
        return int(value)
    share = percent * total
    return -(-share // 100) if round_up else share // 100


def budget_status(
    budget: Mapping[str, Any], pods: list[dict[str, Any]], scale_of: ScaleOf
) -> dict[str, Any]:
    """The status the disruption controller would give ``budget`` over ``pods`` (every
    pod of the cluster; the budget picks its own)."""
    spec = budget.get("spec") or {}
    finished = ("Succeeded", "Failed")
    mine = [
        p
        for p in pods
        if selects(budget, p) and (p.get("status") or {}).get("phase") not in finished
    ]
    healthy = sum(1 for p in mine if _healthy(p))
    minimum, most = spec.get("minAvailable"), spec.get("maxUnavailable")
    expected: int | None
    if minimum is not None and _percent(minimum) is None:
        expected, desired = len(mine), int(minimum)
    else:
        expected = _expected(mine, scale_of)
        if expected is None:  # the controller's failSafe: nothing allowed
            return {"currentHealthy": healthy, "desiredHealthy": 0, "expectedPods": 0,
                    "disruptionsAllowed": 0, "reason": "SyncFailed"}  # fmt: skip
        if most is not None:
            desired = expected - _scaled(most, expected, round_up=True)
        else:
            desired = _scaled(minimum if minimum is not None else 1, expected, round_up=True)
    allowed = healthy - desired if expected > 0 else 0
    return {
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "disruptionsAllowed": max(0, allowed),
        "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
    }


def _expected(pods: list[dict[str, Any]], scale_of: ScaleOf) -> int | None:
    """The sum of the scales of the pods' controllers (each once); None where one has none."""
    scales: dict[str, int] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
        if owner is None:
            continue  # an unmanaged pod: not counted
        scale = scale_of(owner, str(meta.get("namespace")))
        if scale is None:
            return None  # "does not implement the scale subresource"
        scales[str(owner.get("uid"))] = scale
    return sum(scales.values())


def eviction_refusal(
    pod: Mapping[str, Any],
    budgets: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    scale_of: ScaleOf,
) -> tuple[int, str, str, list[dict[str, str]]] | None:
    """Why evicting ``pod`` is refused (code, reason, message, causes); None: delete it.
    ``budgets`` are every budget of the pod's namespace, ``pods`` every pod."""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Pending", "Succeeded", "Failed") or (pod.get("metadata") or {}).get(
        "deletionTimestamp"
    ):
        return None
    mine = [b for b in budgets if selects(b, pod)]
    if len(mine) > 1:
        message = (
            "This pod has more than one PodDisruptionBudget, which the eviction subresource "
            "does not support."
        )
        return 500, "InternalError", message, []
    if not mine:
        return None
    [budget] = mine
    status = budget_status(budget, pods, scale_of)
    if not ready(pod):
        policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
        enough = status["currentHealthy"] >= status["desiredHealthy"] > 0
        if policy == "AlwaysAllow" or enough:
            return None
    if status["disruptionsAllowed"] > 0:
        return None
    name = (budget.get("metadata") or {}).get("name")
    cause = {
        "reason": "DisruptionBudget",
        "message": f"The disruption budget {name} needs {status['desiredHealthy']} healthy "
        f"pods and has {status['currentHealthy']} currently",
    }
    message = "Cannot evict pod as it would violate the pod's disruption budget."
    return 429, "TooManyRequests", message, [cause]
