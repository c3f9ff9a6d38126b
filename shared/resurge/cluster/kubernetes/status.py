"""A job's status as its TrainingJob's status subresource, and its Kubernetes Events:
pure functions, no I/O.

:func:`status_update` turns the ``resurge status --json`` view of a job and its
TrainingJob as read into the status to write: the view, plus what Kubeflow's and
HyperPod's job operators show where they mean the same: ``conditions`` (metav1
Conditions), ``restartCount`` (restarts of every level), ``startTime``,
``completionTime`` and ``observedGeneration``. The new status is a
:class:`~resurge.jobspec.TrainingJobStatus` dumped as JSON, the model the CRD's status
schema is generated from, so nothing written is pruned. Its ``patch`` is the JSON merge
patch (RFC 7386) from the status read to the new one, carrying the object's
``metadata.resourceVersion`` as a precondition: a write that lost a race is refused
with 409, and its writer reads the object again and retries.

The status writer owns the phase conditions (:data:`PHASE_CONDITIONS`), one per type,
each with the TrainingJob's ``metadata.generation`` as its ``observedGeneration``:
``Created`` (True once the job is submitted), one per phase (``Running``,
``Recovering``, ``Resizing``, ``Succeeded``, ``Failed``: True in that phase, False once
it has left it) and ``Suspended`` (True while a job suspended for a higher-priority one
waits). A condition's ``lastTransitionTime`` changes only when its status does. Every
other condition (the controller's ``PodsRefused``) and every field the model does not
own (``submittedGeneration``) is left as it is.

:func:`event_manifests` gives the Events of what a new status shows for the first time:
a recovery (``Recovered``, or ``Recovering`` as it starts), a resize (``Resized``), the
job ending (``Succeeded``/``Failed``), and why a Pending job waits (``Waiting``, a
Warning, as kube-scheduler's ``FailedScheduling``: recorded when the reason's first
clause changes, not each time a node's free count in it does; a new job's bare
"waiting for capacity" is none). Computed from the status read and the one written
over it with its precondition, each is recorded by the one writer whose write won.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from resurge.cluster.kubernetes.times import now_time
from resurge.jobspec import TrainingJobStatus
from resurge.jobspec.status import PHASE_CONDITION_TYPES

__all__ = [
    "PHASE_CONDITIONS",
    "StatusUpdate",
    "event",
    "event_manifests",
    "merge_diff",
    "status_update",
]

PHASE_CONDITIONS = PHASE_CONDITION_TYPES
_ACTIVE = ("Running", "Recovering", "Resizing")
_FINISHED = ("Succeeded", "Failed")
_REPORTER = "resurge"
# metav1.Condition's message is at most this long.
_MESSAGE_LIMIT = 32768
# Fields of the status another writer owns: the controller's last submission.
_NOT_OURS = frozenset({"submittedGeneration"})
_OURS = (
    frozenset(field.alias or name for name, field in TrainingJobStatus.model_fields.items())
    - _NOT_OURS
)


class StatusUpdate(NamedTuple):
    """A status write: the status read, the status to write, and the merge patch from one
    to the other (None when they are the same: nothing to write)."""

    before: dict[str, Any]
    after: dict[str, Any]
    patch: dict[str, Any] | None


def status_update(
    view: dict[str, object], training_job: dict[str, Any], now: str | None = None
) -> StatusUpdate:
    """The write that makes ``training_job``'s status the job's ``view`` (the module
    docstring); ``now`` stamps the transitions it makes (default: now).

    Raises:
        pydantic.ValidationError: ``view`` has a field the status model lacks, or a
            value it refuses (a bug: the view and the model are held together by tests).
    """
    now = now or now_time()
    meta = training_job.get("metadata") or {}
    before = dict(training_job.get("status") or {})
    generation = meta.get("generation")
    phase = str(view.get("phase") or "Pending")
    restarts = view.get("restarts")
    total = (
        sum(v for v in restarts.values() if isinstance(v, int)) if isinstance(restarts, dict) else 0
    )
    times = {
        "startTime": before.get("startTime") or (now if phase in _ACTIVE else None),
        "completionTime": before.get("completionTime") or (now if phase in _FINISHED else None),
    }
    status = TrainingJobStatus.model_validate(
        {
            **view,
            **times,
            "restartCount": total,
            "observedGeneration": generation,
            "conditions": _conditions(view, before, generation, now),
        }
    )
    ours = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    after = {**{k: v for k, v in before.items() if k not in _OURS}, **ours}
    diff = merge_diff(before, after)
    if not diff:
        return StatusUpdate(before, after, None)
    precondition = {"resourceVersion": meta["resourceVersion"]} if "resourceVersion" in meta else {}
    return StatusUpdate(before, after, {"metadata": precondition, "status": diff})


def _holds(view: dict[str, object], phase: str) -> dict[str, bool]:
    """Which phase conditions hold for a job in ``view``."""
    resize = view.get("lastResize")
    suspended = (
        phase == "Pending" and isinstance(resize, dict) and resize.get("resize") == "suspend"
    )
    holds = {name: name == phase for name in PHASE_CONDITIONS}
    return {**holds, "Created": True, "Suspended": suspended}


def _conditions(
    view: dict[str, object], before: dict[str, Any], generation: Any, now: str
) -> list[dict[str, Any]]:
    """The phase conditions for ``view`` (the module docstring), then every other
    condition of ``before`` as it was."""
    phase = str(view.get("phase") or "Pending")
    message = str(view.get("message") or "")[:_MESSAGE_LIMIT]
    old = {c.get("type"): c for c in before.get("conditions") or [] if isinstance(c, dict)}
    conditions: list[dict[str, Any]] = []
    for name, holds in _holds(view, phase).items():
        previous = old.get(name)
        status = "True" if holds else "False"
        if previous is None and not holds:
            continue  # a condition the job never had stays unset
        since = (
            now
            if previous is None or previous.get("status") != status
            else previous.get("lastTransitionTime", now)
        )
        reason = "Submitted" if name == "Created" else name if holds else phase
        conditions.append(
            {
                "type": name,
                "status": status,
                "observedGeneration": generation if isinstance(generation, int) else None,
                "lastTransitionTime": since,
                "reason": reason,
                "message": message if holds and name != "Created" else "",
            }
        )
    others = [c for t, c in old.items() if t not in PHASE_CONDITIONS]
    return conditions + others


def merge_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``before`` into ``after``: keys gone
    become null, objects are diffed key by key, anything else changed is given whole."""
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            inner = merge_diff(old, value)
            if inner:
                patch[key] = inner
        elif key not in before or old != value:
            patch[key] = value
    return patch


def event(training_job: dict[str, Any], reason: str, message: str, warning: bool) -> dict[str, Any]:
    """A Kubernetes Event about ``training_job``."""
    meta = training_job["metadata"]
    now = now_time()
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
    waiting = _waiting(after)
    if waiting is not None and waiting != _waiting(before):
        events.append(event(training_job, "Waiting", str(after.get("message")), warning=True))
    if phase in ("Succeeded", "Failed") and before.get("phase") != phase:
        events.append(
            event(training_job, str(phase), str(after.get("message") or ""), phase == "Failed")
        )
    return events


def _waiting(status: dict[str, Any]) -> str | None:
    """The first clause of why a Pending job waits (past an earlier step's words, which
    come before a ``|``); None when the job is not Pending or gives no reason (a new
    job's bare "waiting for capacity", before the scaler looked)."""
    message = status.get("message")
    if status.get("phase") != "Pending" or not isinstance(message, str):
        return None
    clause = message.rsplit(" | ", 1)[-1].split(";", 1)[0]
    return clause if ":" in clause else None
