"""Conditions on a TrainingJob's status: pure functions, no I/O.

A condition is a ``metav1.Condition`` (type, status ``True``/``False``/``Unknown``,
observedGeneration, lastTransitionTime, reason, message). Several writers share the
``conditions`` list (the status writer its phase conditions, the controller
``PodsRefused`` and a rejected spec's ``Failed``), and a merge patch replaces a list
whole: so each writer reads the object, changes only its own types
(:func:`with_condition`) and patches with the ``metadata.resourceVersion`` it read as a
precondition, reading again and retrying on 409 Conflict
(:meth:`~.api.KubeApi.update_training_job_status`).
"""

from __future__ import annotations

from typing import Any

from resurge.cluster.kubernetes.times import now_time

__all__ = ["condition", "with_condition"]


def condition(
    kind: str, status: bool, reason: str, message: str, generation: int
) -> dict[str, Any]:
    """A ``metav1.Condition`` of ``kind``, True or False, stamped now."""
    return {
        "type": kind,
        "status": "True" if status else "False",
        "observedGeneration": generation,
        "lastTransitionTime": now_time(),
        "reason": reason,
        "message": message,
    }


def with_condition(conditions: object, new: dict[str, Any]) -> list[dict[str, Any]]:
    """``conditions`` with ``new`` in place of the one of its type (appended where there
    is none); its lastTransitionTime kept where the status did not change. The others
    are left as they are."""
    listed = [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []
    old = next((c for c in listed if c.get("type") == new["type"]), None)
    if old is not None and old.get("status") == new["status"] and old.get("lastTransitionTime"):
        new = {**new, "lastTransitionTime": old["lastTransitionTime"]}
    if old is None:
        return [*listed, new]
    return [new if c is old else c for c in listed]
