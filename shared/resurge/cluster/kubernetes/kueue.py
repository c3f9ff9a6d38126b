"""A TrainingJob as one Kueue workload: the ``Workload`` resurge creates, and what Kueue's
answer means. Pure functions; the controller's side is :mod:`.queueing`.

Kueue (https://kueue.sigs.k8s.io/docs/concepts/workload/) admits a ``Workload``
(``kueue.x-k8s.io/v1beta1``) as a whole: its pod sets, each a ``count`` of pods of one
``template``, fit the quota of the ClusterQueue its LocalQueue (``spec.queueName``)
points to, or it waits. A framework Kueue does not know (its ``externalFrameworks``)
creates the Workload itself, owned by its job, and starts no pod before Kueue admits it:
``status.admission`` set and the condition ``Admitted`` True. ``status.admission``'s
``podSetAssignments[].flavors`` name, per resource, the ResourceFlavor whose quota was
used, and that flavor's ``spec.nodeLabels`` are where the pods must land. Kueue preempts
by evicting (``Evicted`` True, ``QuotaReserved`` and ``Admitted`` False); the job frees
what it holds and waits to be admitted again. A finished job marks its Workload
``Finished``, which releases the quota.

A TrainingJob is queued when it has a queue: the label ``kueue.x-k8s.io/queue-name``
(as on every job Kueue manages) or ``spec.queue``. Its priority is the
WorkloadPriorityClass its label ``kueue.x-k8s.io/priority-class`` names.

An elastic job (``replicas.max`` above ``min``) is two Workloads, told apart by the
label ``resurge.dev/kueue-part``: the ``base`` one of its ``min`` replicas, and the
``elastic`` one of the rest, which resurge creates once the base is admitted. Kueue
admits and preempts each whole, so preempting the elastic one (admitted later, it is
the first of the job's to go among equal priorities) shrinks the job to ``min``, and
admitting it again lets it grow back (:func:`allowed_replicas`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from resurge.cluster.kubernetes.objects import QUEUE_LABEL, owner_reference

__all__ = [
    "ADMITTED",
    "BASE",
    "ELASTIC",
    "EVICTED",
    "FINISHED",
    "KUEUE_GROUP",
    "KUEUE_VERSION",
    "PART_LABEL",
    "PODSET",
    "PRIORITY_CLASS_LABEL",
    "QUEUE_LABEL",
    "QUOTA_RESERVED",
    "WORKLOAD_PRIORITY_CLASS_SOURCE",
    "Admission",
    "admission_of",
    "allowed_replicas",
    "finished_condition",
    "flavor_node_labels",
    "part_of",
    "priority_class_of",
    "queue_of",
    "replica_bounds",
    "with_node_labels",
    "workload_manifest",
    "workload_name",
]

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
WORKLOAD_PRIORITY_CLASS_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
# The Workload's condition types (Kueue's apis/kueue/v1beta1/workload_types.go).
ADMITTED = "Admitted"
QUOTA_RESERVED = "QuotaReserved"
EVICTED = "Evicted"
FINISHED = "Finished"
# The one pod set of a TrainingJob's Workload: its replicas' pods.
PODSET = "workers"
# Which of an elastic job's Workloads one is: its min replicas', or the rest's.
PART_LABEL = "resurge.dev/kueue-part"
BASE = "base"
ELASTIC = "elastic"

_NAME_MAX = 63


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _labels(training_job: dict[str, Any]) -> dict[str, str]:
    return {
        str(k): str(v)
        for k, v in _mapping(_mapping(training_job.get("metadata")).get("labels")).items()
    }


def queue_of(training_job: dict[str, Any]) -> str | None:
    """The LocalQueue a TrainingJob is submitted to: its label
    ``kueue.x-k8s.io/queue-name``, else its ``spec.queue``; None: not queued."""
    queue = _labels(training_job).get(QUEUE_LABEL) or _mapping(training_job.get("spec")).get(
        "queue"
    )
    return str(queue) if queue else None


def priority_class_of(training_job: dict[str, Any]) -> str | None:
    """The WorkloadPriorityClass a TrainingJob's label ``kueue.x-k8s.io/priority-class``
    names; None where it names none."""
    return _labels(training_job).get(PRIORITY_CLASS_LABEL) or None


def workload_name(training_job: dict[str, Any], part: str = BASE) -> str:
    """The name of a TrainingJob's Workload: ``trainingjob-<name>-<uid's first 5>``
    (``-elastic`` after it for the elastic part), cut to 63 characters as Kueue cuts the
    names of the Workloads it makes, so a new TrainingJob of the same name never takes
    its predecessor's Workload."""
    meta = _mapping(training_job.get("metadata"))
    tail = str(meta.get("uid") or "")[:5] + ("-elastic" if part == ELASTIC else "")
    prefix = f"trainingjob-{meta.get('name')}"[: _NAME_MAX - len(tail) - 1].rstrip("-.")
    return f"{prefix}-{tail}" if tail else prefix


def replica_bounds(training_job: dict[str, Any]) -> tuple[int, int]:
    """A TrainingJob's ``replicas.min`` and ``replicas.max`` (``min`` where unset)."""
    replicas = _mapping(_mapping(training_job.get("spec")).get("replicas"))
    low = int(replicas.get("min") or 1)
    return low, max(low, int(replicas.get("max") or low))


def part_of(workload: dict[str, Any]) -> str:
    """Which part of its job ``workload`` is (:data:`BASE` where unlabelled)."""
    labels = _mapping(_mapping(workload.get("metadata")).get("labels"))
    return ELASTIC if labels.get(PART_LABEL) == ELASTIC else BASE


def _pod_template(pod: dict[str, Any]) -> dict[str, Any]:
    """What Kueue needs of a pod (its requests, and where it may run) as a
    PodTemplateSpec: no node pin, no environment, no command."""
    spec = _mapping(pod.get("spec"))
    containers = [
        {
            "name": c.get("name"),
            "image": c.get("image"),
            "resources": {"requests": dict(_mapping(_mapping(c.get("resources")).get("requests")))},
        }
        for c in spec.get("containers") or []
        if isinstance(c, dict)
    ]
    template_spec: dict[str, Any] = {"containers": containers, "restartPolicy": "OnFailure"}
    for kept in ("nodeSelector", "tolerations", "priorityClassName"):
        if spec.get(kept):
            template_spec[kept] = copy.deepcopy(spec[kept])
    return {"spec": template_spec}


def workload_manifest(
    training_job: dict[str, Any],
    pod: dict[str, Any],
    count: int,
    priority: int | None = None,
    part: str = BASE,
) -> dict[str, Any]:
    """A Workload of a queued TrainingJob (its ``part``): one pod set of ``count`` pods
    (replicas) whose template holds ``pod``'s requests, node selector and tolerations;
    the job's LocalQueue; its WorkloadPriorityClass and that class's ``priority`` value
    (Kueue's schema wants both or neither); the TrainingJob as controlling owner, so the
    Workload goes with it."""
    meta = _mapping(training_job.get("metadata"))
    spec: dict[str, Any] = {
        "queueName": queue_of(training_job),
        "podSets": [{"name": PODSET, "count": count, "template": _pod_template(pod)}],
    }
    priority_class = priority_class_of(training_job)
    if priority_class is not None and priority is not None:
        spec["priorityClassName"] = priority_class
        spec["priorityClassSource"] = WORKLOAD_PRIORITY_CLASS_SOURCE
        spec["priority"] = priority
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(training_job, part),
            "namespace": meta.get("namespace"),
            "labels": {QUEUE_LABEL: spec["queueName"], PART_LABEL: part},
            "ownerReferences": [owner_reference(training_job)],
        },
        "spec": spec,
    }


def _condition(workload: dict[str, Any], kind: str) -> bool:
    conditions = _mapping(workload.get("status")).get("conditions") or []
    return any(
        isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True"
        for c in conditions
    )


@dataclass(frozen=True)
class Admission:
    """What a Workload's status says: ``admitted`` (``status.admission`` and
    ``Admitted`` True), ``count`` the pods admitted (Kueue's partial admission may
    admit fewer than asked), ``flavors`` the ResourceFlavors of the admission,
    ``evicted`` (``Evicted`` True: preempted or otherwise put out) and ``finished``."""

    admitted: bool
    count: int
    flavors: tuple[str, ...]
    evicted: bool
    finished: bool


def admission_of(workload: dict[str, Any]) -> Admission:
    """The :class:`Admission` of ``workload`` (a Workload as read)."""
    admission = _mapping(_mapping(workload.get("status")).get("admission"))
    assignments = [a for a in admission.get("podSetAssignments") or [] if isinstance(a, dict)]
    mine = next((a for a in assignments if a.get("name") == PODSET), {})
    podsets = _mapping(workload.get("spec")).get("podSets") or [{}]
    asked = next((p.get("count") for p in podsets if p.get("name") == PODSET), 0)
    admitted = bool(admission) and _condition(workload, ADMITTED)
    count = mine.get("count", asked) if admitted else 0
    flavors = sorted({str(f) for f in _mapping(mine.get("flavors")).values()})
    return Admission(
        admitted=admitted,
        count=int(count or 0),
        flavors=tuple(flavors) if admitted else (),
        evicted=_condition(workload, EVICTED),
        finished=_condition(workload, FINISHED),
    )


def allowed_replicas(
    base: Admission | None, elastic: Admission | None, bounds: tuple[int, int]
) -> int:
    """How many replicas Kueue lets a job of ``bounds`` (min, max) run: none while its
    base Workload is not admitted; ``min`` with it; up to ``max`` with the elastic part
    (the count admitted of it) too."""
    low, high = bounds
    if base is None or not base.admitted:
        return 0
    extra = elastic.count if elastic is not None and elastic.admitted else 0
    return min(high, low + extra)


def flavor_node_labels(flavors: list[dict[str, Any]]) -> dict[str, str]:
    """The node labels the pods of an admission must carry: every ResourceFlavor's
    ``spec.nodeLabels`` (``flavors``: those the admission names, as read)."""
    labels: dict[str, str] = {}
    for flavor in flavors:
        for key, value in _mapping(_mapping(flavor.get("spec")).get("nodeLabels")).items():
            labels[str(key)] = str(value)
    return labels


def with_node_labels(training_job: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """A copy of ``training_job`` whose pod template's ``nodeSelector`` also holds
    ``labels`` (an admitted flavor's), which :func:`~.objects.pod_manifest` keeps."""
    if not labels:
        return training_job
    changed = copy.deepcopy(training_job)
    spec: dict[str, Any] = changed.setdefault("spec", {})
    template = _mapping(spec.get("template"))
    pod_spec = _mapping(template.get("spec"))
    pod_spec["nodeSelector"] = {**_mapping(pod_spec.get("nodeSelector")), **labels}
    spec["template"] = {**template, "spec": pod_spec}
    return changed


def finished_condition(phase: str, message: str, now: str) -> dict[str, Any]:
    """The ``Finished`` condition of the Workload of a job that ended in ``phase``
    (Succeeded or Failed), as Kueue's job framework writes it; ``now`` the time."""
    return {
        "type": FINISHED,
        "status": "True",
        "reason": phase,
        "message": message or f"the TrainingJob {phase.lower()}",
        "lastTransitionTime": now,
    }
