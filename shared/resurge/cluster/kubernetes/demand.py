"""Demand pods: what a job that fits nowhere shows a cluster autoscaler. Pure, no I/O.

resurge places a job's worker groups itself and creates a pod only for a placement,
so a job waiting for room has no pod, and cluster-autoscaler or Karpenter, which add
nodes for Pending pods, see no demand. A TrainingJob annotated
``resurge.dev/demand-pods: "true"`` gets, while it is Pending for want of room,
``replicas.min`` **demand pods**: unpinned pods the cluster's scheduler cannot place
until a node that fits one is added, each shaped as one of the job's worker groups (its
template's nodeSelector, node affinity, tolerations and priority class; ``nprocPerNode``
of its accelerator; the nodes the job avoids as a ``NotIn`` term) and doing nothing
(``sleep infinity`` in the job's image). A job in a Kueue queue gets none: its demand
is Kueue's to show. They are labelled ``resurge.dev/job`` and
``resurge.dev/demand``, owned by the TrainingJob, never counted as using a node
(:func:`~.scheduling.in_use`), and deleted as soon as the job is no longer Pending,
before its own pods need their room.
"""

from __future__ import annotations

import copy
from typing import Any

from resurge.cluster.kubernetes.objects import DEMAND_LABEL, with_required
from resurge.jobspec.accelerator import job_accelerator

__all__ = [
    "DEMAND_ANNOTATION",
    "DEMAND_LABEL",
    "demand_pods",
    "waits_for_room",
    "wants_demand_pods",
]

DEMAND_ANNOTATION = "resurge.dev/demand-pods"
# How the scaler's wait reasons for want of room begin.
_NO_ROOM = ("waiting for capacity:", "no node of this cluster can hold it")


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def wants_demand_pods(training_job: dict[str, Any]) -> bool:
    """Whether the TrainingJob asks for demand pods (its annotation is ``"true"``) and
    may have them: not a job in a Kueue queue (``spec.queue``), whose demand is Kueue's
    to show (its ProvisioningRequest admission check) and whose pods Kueue gates."""
    annotations = _mapping(_mapping(training_job.get("metadata")).get("annotations"))
    queued = bool(_mapping(training_job.get("spec")).get("queue"))
    return str(annotations.get(DEMAND_ANNOTATION, "")).lower() == "true" and not queued


def waits_for_room(status: dict[str, object]) -> bool:
    """Whether a job's status says it is Pending for want of room: the scaler looked
    and gave its reason (a new job's bare "waiting for capacity" is not one yet)."""
    message = status.get("message")
    return (
        status.get("phase") == "Pending"
        and isinstance(message, str)
        and any(reason in message for reason in _NO_ROOM)
    )


def demand_pods(
    training_job: dict[str, Any],
    labels: dict[str, str],
    owner: dict[str, Any],
    default_image: str,
    avoid: list[str] | tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The demand pods of ``training_job`` (the module docstring), each labelled
    ``labels`` (the job's) and owned by ``owner``."""
    meta = _mapping(training_job.get("metadata"))
    job_spec = _mapping(training_job.get("spec"))
    replicas = _mapping(job_spec.get("replicas"))
    count = int(replicas.get("min") or 1)
    nproc = int(job_spec.get("nprocPerNode") or 1)
    template = _mapping(copy.deepcopy(job_spec.get("template")))
    spec = _mapping(template.get("spec"))
    first = _mapping((spec.get("containers") or [{}])[0])
    resources: dict[str, Any] = {}
    accelerator = job_accelerator(job_spec)
    if accelerator is not None:
        resources = {kind: {accelerator: str(nproc)} for kind in ("requests", "limits")}
    container = {
        "name": "demand",
        "image": job_spec.get("image") or first.get("image") or default_image,
        "command": ["sleep", "infinity"],
        "resources": resources,
    }
    pod_spec: dict[str, Any] = {
        key: spec[key]
        for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName")
        if key in spec
    }
    if job_spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = job_spec["priorityClassName"]
    if avoid:
        away = {"key": "metadata.name", "operator": "NotIn", "values": sorted(avoid)}
        pod_spec["affinity"] = with_required(_mapping(pod_spec.get("affinity")), [away])
    pod_spec.update(
        {"containers": [container], "restartPolicy": "Always", "terminationGracePeriodSeconds": 0}
    )
    name = str(meta.get("name"))
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name[:230]}-demand-{index}",
                "labels": {**labels, DEMAND_LABEL: "true"},
                "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
                "ownerReferences": [owner],
            },
            "spec": copy.deepcopy(pod_spec),
        }
        for index in range(count)
    ]
