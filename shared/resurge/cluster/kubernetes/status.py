"""A job's status as its TrainingJob's status subresource, and its Kubernetes Events:
pure functions, no I/O.

:func:`status_patch` is the merge patch of ``status``: the ``resurge status --json``
object, plus the fields Kubeflow's and HyperPod's job operators show where they mean
the same: ``conditions`` (one per phase the job has been in, the current one True),
``restartCount`` (restarts of every level), ``startTime`` and ``completionTime``.
:func:`event_manifests` gives the Events of what a new status shows for the first time:
a recovery (``Recovered``, or ``Recovering`` as it starts), a resize (``Resized``), the
job ending (``Succeeded``/``Failed``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

__all__ = ["event", "event_manifests", "status_patch"]

_PHASES = ("Pending", "Running", "Recovering", "Resizing", "Succeeded", "Failed")
_REPORTER = "resurge"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_patch(status: dict[str, object], before: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that makes a TrainingJob's status ``status`` (see the module
    docstring); ``before`` is its status now, whose conditions and times it keeps."""
    phase = str(status.get("phase") or "")
    now = _now()
    conditions: list[dict[str, Any]] = []
    known = {c.get("type"): c for c in before.get("conditions") or [] if isinstance(c, dict)}
    for name in _PHASES:
        old = known.get(name)
        current = "True" if name == phase else "False"
        if old is None and current == "False":
            continue
        since = now if old is None or old.get("status") != current else None
        conditions.append(
            {
                "type": name,
                "status": current,
                "reason": name,
                "message": str(status.get("message") or "") if current == "True" else "",
                "lastTransitionTime": since or (old or {}).get("lastTransitionTime", now),
            }
        )
    restarts = status.get("restarts")
    total = (
        sum(v for v in restarts.values() if isinstance(v, int)) if isinstance(restarts, dict) else 0
    )
    extra: dict[str, Any] = {"conditions": conditions, "restartCount": total}
    if phase in ("Running", "Recovering", "Resizing") and not before.get("startTime"):
        extra["startTime"] = now
    if phase in ("Succeeded", "Failed") and not before.get("completionTime"):
        extra["completionTime"] = now
    return {"status": {**status, **extra}}


def event(training_job: dict[str, Any], reason: str, message: str, warning: bool) -> dict[str, Any]:
    """A Kubernetes Event about ``training_job``."""
    meta = training_job["metadata"]
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
            "namespace": meta.get("namespace", "default"),
        },
        "involvedObject": {
            "apiVersion": training_job.get("apiVersion", "resurge.dev/v1alpha1"),
            "kind": "TrainingJob",
            "name": meta["name"],
            "namespace": meta.get("namespace", "default"),
            "uid": meta.get("uid", ""),
        },
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": _REPORTER},
        "reportingComponent": _REPORTER,
        "reportingInstance": _REPORTER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def _changed(
    before: dict[str, Any], after: dict[str, object], key: str, identity: str
) -> dict[str, Any] | None:
    """``after[key]`` when it is a new one of its kind: its ``identity`` field differs
    from ``before``'s (a recovery's generation, a resize's time), so filling in a detail
    later (its seconds) records nothing twice."""
    value = after.get(key)
    old = before.get(key)
    if not isinstance(value, dict) or not value:
        return None
    if isinstance(old, dict) and old.get(identity) == value.get(identity):
        return None
    return value


def event_manifests(
    training_job: dict[str, Any], before: dict[str, Any], after: dict[str, object]
) -> list[dict[str, Any]]:
    """The Events of what ``after`` shows that ``before`` did not."""
    events = []
    recovery = _changed(before, after, "recovery", "toGeneration")
    if recovery is not None:
        events.append(
            event(
                training_job,
                "Recovering",
                f"{recovery.get('level')} restart after {recovery.get('reason')}, "
                f"to generation {recovery.get('toGeneration')}",
                warning=True,
            )
        )
    recovered = _changed(before, after, "lastRecovery", "generation")
    if recovered is not None:
        events.append(
            event(
                training_job,
                "Recovered",
                f"{recovered.get('level')} restart after {recovered.get('reason')} took "
                f"{recovered.get('seconds')} s; now generation {recovered.get('generation')}",
                warning=False,
            )
        )
    resized = _changed(before, after, "lastResize", "time")
    if resized is not None:
        events.append(
            event(
                training_job,
                "Resized",
                f"{resized.get('resize')} from {resized.get('from')} to {resized.get('to')} "
                f"replicas: {resized.get('why')}",
                warning=False,
            )
        )
    phase = after.get("phase")
    if phase in ("Succeeded", "Failed") and before.get("phase") != phase:
        events.append(
            event(training_job, str(phase), str(after.get("message") or ""), phase == "Failed")
        )
    return events
