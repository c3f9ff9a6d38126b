"""How resurge's records look as Kubernetes objects, and back: pure functions, no I/O.

- A Node is a :class:`NodeInfo`: slots are the node's allocatable of the accelerator
  resource the installation counts (the ``kube_accelerator`` setting, ``nvidia.com/gpu``
  by default) where a device plugin advertises it, else what its monitor reports (a
  node of kind or an emulator, whose monitor simulates GPUs); healthy
  means Ready (a node with no Ready condition yet counts as ready), not tainted
  ``resurge.dev/unhealthy``, and healthy as its monitor last said; cordoned means
  ``spec.unschedulable`` or the unhealthy taint, with the reason kept in an annotation.
  The monitor's own report (slots, health, address, labels it added) is the annotation
  ``resurge.dev/monitor``; its heartbeat is its node's Lease (:mod:`.node_lease`), whose
  renewal time the caller passes to :func:`node_info`.
- A cordon (:func:`cordon_patch`) and its undoing (:func:`uncordon_patch`) are merge
  patches made from the node as read and carrying its ``resourceVersion``: the server
  refuses one (409) if the node changed since, so a taint another controller added
  meanwhile is never overwritten. Uncordon removes only what resurge added: its taint,
  its reason, and ``spec.unschedulable`` only where resurge set it (annotation
  ``resurge.dev/cordon-unschedulable``), never an administrator's own cordon.
- A worker group is a pod pinned to its node by required node affinity, requesting
  ``nproc`` of its job's accelerator (:mod:`resurge.jobspec.accelerator`: none for a
  CPU-only job), whose container runs ``resurge-node-agent launch`` with the group's spec in
  ``RESURGE_WORKER_GROUP`` (its job's bus name, :mod:`.identity`); labels
  ``resurge.dev/job`` (the TrainingJob's name in its namespace, as is the pod's name)
  and ``resurge.dev/replica``;
  owned by the TrainingJob when there is one, which also gives the image, the pod
  template, the Kueue queue and the PriorityClass. It tolerates every ``NoExecute``
  taint for its job's checkpoint deadline and a margin, after the template's own
  tolerations (:mod:`.disruption`).
- A job has a headless Service selecting its pods (publishing not-ready ones), named
  :func:`~resurge.cluster.names.service_name` of the job.
- Networking: the backend gives a job on the pod network (:func:`host_network` false:
  the template's ``spec.hostNetwork``, else the ``kube_host_network`` setting) a domain,
  :func:`worker_domain`, which each of its groups carries. A group with a ``domain`` is
  a pod on the pod network, with ``spec.hostname``
  (:func:`~resurge.cluster.names.worker_hostname`) and ``spec.subdomain`` the job's
  Service, so it is ``<hostname>.<service>.<namespace>.svc``; a group without one is on
  the host network, with neither, the ``ClusterFirstWithHostNet`` DNS policy unless the
  template sets one, and is reached at its node's address. A pod's network thus always
  matches the address its job's ranks are given, also for a job submitted before a
  setting changed.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from resurge.cluster.kubernetes.disruption import no_execute_toleration
from resurge.cluster.kubernetes.identity import local_name
from resurge.cluster.kubernetes.times import parse_time
from resurge.cluster.names import group_digest, service_name, worker_hostname
from resurge.cluster.protocol import WORKER_GROUP_ENV, NodeInfo, Taint, WorkerGroupSpec
from resurge.jobspec.accelerator import job_accelerator

__all__ = [
    "CORDON_REASON_ANNOTATION",
    "CORDON_UNSCHEDULABLE_ANNOTATION",
    "DEMAND_LABEL",
    "GROUP_ANNOTATION",
    "JOB_LABEL",
    "MONITOR_ANNOTATION",
    "QUEUE_LABEL",
    "REPLICA_LABEL",
    "UNHEALTHY_TAINT",
    "MonitorReport",
    "cordon_patch",
    "group_of_pod",
    "host_network",
    "job_service",
    "node_info",
    "node_manifest",
    "owner_reference",
    "pod_manifest",
    "pod_name",
    "resurge_cordon",
    "uncordon_patch",
    "with_required",
    "worker_domain",
]

GROUP = "resurge.dev"
JOB_LABEL = f"{GROUP}/job"
REPLICA_LABEL = f"{GROUP}/replica"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
UNHEALTHY_TAINT = f"{GROUP}/unhealthy"
CORDON_REASON_ANNOTATION = f"{GROUP}/cordon-reason"
CORDON_UNSCHEDULABLE_ANNOTATION = f"{GROUP}/cordon-unschedulable"
MONITOR_ANNOTATION = f"{GROUP}/monitor"
GROUP_ANNOTATION = f"{GROUP}/worker-group"
# The label of a job's demand pods (:mod:`.demand`).
DEMAND_LABEL = f"{GROUP}/demand"
# The accelerator resource a node's slots count unless the installation names another
# (the kube_accelerator setting).
GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER = "agent"


class MonitorReport(BaseModel):
    """What a node's monitor last reported, kept on the Node as an annotation."""

    model_config = ConfigDict(extra="ignore")

    slots: int = Field(ge=0)
    healthy: bool = True
    address: str = "127.0.0.1"
    labels: dict[str, str] = Field(default_factory=dict)
    heartbeat: datetime


def _mapping(value: object) -> dict[str, Any]:
    """``value`` if it is a JSON object, else empty: a malformed part of an object is
    read as missing, never a crash of the watch that reads it."""
    return value if isinstance(value, dict) else {}


def _objects(value: object) -> list[dict[str, Any]]:
    """The JSON objects in ``value`` if it is a list, else none."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _count(value: object) -> int:
    """A whole, non-negative quantity such as ``"8"``; 0 when it is anything else."""
    try:
        return max(0, int(str(value)))
    except ValueError:  # "abc", "1.5", "4Gi", more digits than Python converts
        return 0


def _ready(node: dict[str, Any]) -> tuple[bool, datetime | None]:
    """Whether the node is Ready (no Ready condition yet counts as ready) and when its
    kubelet last said so."""
    for condition in _objects(_mapping(node.get("status")).get("conditions")):
        if condition.get("type") == "Ready":
            return condition.get("status") == "True", parse_time(condition.get("lastHeartbeatTime"))
    return True, None


def monitor_report(node: dict[str, Any]) -> MonitorReport | None:
    """The monitor's report on ``node``; None where none (or an unreadable one) is."""
    text = _mapping(_mapping(node.get("metadata")).get("annotations")).get(MONITOR_ANNOTATION)
    if not text or not isinstance(text, str):
        return None
    try:
        return MonitorReport.model_validate_json(text)
    except ValueError:
        return None


def _unhealthy_taint(node: dict[str, Any]) -> bool:
    return any(t.get("key") == UNHEALTHY_TAINT for t in _taints(node))


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return _objects(_mapping(node.get("spec")).get("taints"))


def node_info(
    node: dict[str, Any], renewed: datetime | None = None, accelerator: str = GPU_RESOURCE
) -> NodeInfo:
    """The :class:`NodeInfo` of a Node object; ``renewed``: when its monitor last renewed
    the node's Lease (the heartbeat), if it has one; ``accelerator``: the resource its
    slots count (the ``kube_accelerator`` setting).

    A malformed part reads as missing (an allocatable count that is not a whole
    number as 0 slots), so one odd Node never stops the watch that reads the others."""
    node = _mapping(node)
    meta = _mapping(node.get("metadata"))
    status = _mapping(node.get("status"))
    annotations = _mapping(meta.get("annotations"))
    report = monitor_report(node)
    ready, kubelet_heartbeat = _ready(node)
    cordoned = bool(_mapping(node.get("spec")).get("unschedulable")) or _unhealthy_taint(node)
    if renewed is not None:
        heartbeat = renewed
    elif report is not None:
        heartbeat = report.heartbeat
    else:
        heartbeat = (
            kubelet_heartbeat or parse_time(meta.get("creationTimestamp")) or datetime.now(UTC)
        )
    return NodeInfo(
        name=str(meta.get("name")),
        slots=_slots(report, _mapping(status.get("allocatable")).get(accelerator)),
        healthy=ready and not cordoned and (report is None or report.healthy),
        cordoned=cordoned,
        cordon_reason=str(annotations.get(CORDON_REASON_ANNOTATION) or "") if cordoned else "",
        address=_internal_ip(status) or (report.address if report is not None else "127.0.0.1"),
        labels={
            key: value
            for key, value in _mapping(meta.get("labels")).items()
            if isinstance(value, str)
        },
        taints=[
            Taint(key=t["key"], value=str(t.get("value") or ""), effect=t["effect"])
            for t in _taints(node)
            if isinstance(t.get("key"), str) and isinstance(t.get("effect"), str)
        ],
        heartbeat=heartbeat,
    )


def _slots(report: MonitorReport | None, allocatable: object) -> int:
    """The devices the kubelet says are allocatable, where it says any (the scheduler
    places the pods by them: a monitor's count, such as its ``--gpus`` default, never
    caps them); else the slots the monitor reports (0 where none did)."""
    if allocatable is not None:
        return _count(allocatable)
    return report.slots if report is not None else 0


def _internal_ip(status: dict[str, Any]) -> str | None:
    """The node's first ``InternalIP`` address."""
    return next(
        (
            a["address"]
            for a in _objects(status.get("addresses"))
            if a.get("type") == "InternalIP" and isinstance(a.get("address"), str)
        ),
        None,
    )


def node_ready(node: dict[str, Any]) -> bool:
    """Whether the node's kubelet says it is Ready (or has not said otherwise)."""
    return _ready(node)[0]


def report_patch(node: dict[str, Any] | None, info: NodeInfo) -> dict[str, Any]:
    """The merge patch that records ``info`` (a monitor's report) on ``node``: the
    annotation, and the monitor's labels (ones it reported before and no longer does
    are removed; others' labels are left alone)."""
    before = monitor_report(node) if node is not None else None
    labels: dict[str, str | None] = dict.fromkeys(
        (before.labels if before is not None else {}).keys() - info.labels.keys()
    )
    labels.update(info.labels)
    report = MonitorReport(
        slots=info.slots,
        healthy=info.healthy,
        address=info.address,
        labels=info.labels,
        heartbeat=info.heartbeat,
    )
    return {
        "metadata": {
            "labels": labels,
            "annotations": {MONITOR_ANNOTATION: report.model_dump_json()},
        }
    }


def node_manifest(info: NodeInfo) -> dict[str, Any]:
    """A Node registered from a monitor's report, where no kubelet registered it."""
    manifest = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": info.name}}
    manifest["status"] = {"addresses": [{"type": "InternalIP", "address": info.address}]}
    patch = report_patch(None, info)
    manifest["metadata"].update(patch["metadata"])  # type: ignore[attr-defined]
    return manifest


def _version(node: dict[str, Any]) -> str | None:
    return _mapping(node.get("metadata")).get("resourceVersion")


def cordon_patch(node: dict[str, Any], reason: str) -> dict[str, Any]:
    """Unschedulable, tainted ``resurge.dev/unhealthy=true:NoSchedule``, reason kept; made
    from ``node`` as read, valid only while it is unchanged (its ``resourceVersion``).
    Where ``node`` was not unschedulable, an annotation says resurge made it so."""
    taints = [t for t in _taints(node) if t.get("key") != UNHEALTHY_TAINT]
    taints.append({"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"})
    annotations: dict[str, str] = {CORDON_REASON_ANNOTATION: reason}
    if not _mapping(node.get("spec")).get("unschedulable"):
        annotations[CORDON_UNSCHEDULABLE_ANNOTATION] = "true"
    return {
        "metadata": {"annotations": annotations, "resourceVersion": _version(node)},
        "spec": {"unschedulable": True, "taints": taints},
    }


def uncordon_patch(node: dict[str, Any]) -> dict[str, Any]:
    """Undo :func:`cordon_patch` on ``node`` as read (its ``resourceVersion`` a
    precondition): the unhealthy taint and the reason go; ``spec.unschedulable`` only if
    resurge set it."""
    taints = [t for t in _taints(node) if t.get("key") != UNHEALTHY_TAINT]
    annotations = _mapping(_mapping(node.get("metadata")).get("annotations"))
    patch: dict[str, Any] = {
        "metadata": {
            "annotations": {CORDON_REASON_ANNOTATION: None, CORDON_UNSCHEDULABLE_ANNOTATION: None},
            "resourceVersion": _version(node),
        },
        "spec": {"taints": taints or None},
    }
    if annotations.get(CORDON_UNSCHEDULABLE_ANNOTATION) == "true":
        patch["spec"]["unschedulable"] = None
    return patch


def resurge_cordon(node: dict[str, Any]) -> bool:
    """Whether anything of a resurge cordon is on ``node`` (what :func:`uncordon_patch`
    would remove)."""
    annotations = _mapping(_mapping(node.get("metadata")).get("annotations"))
    return _unhealthy_taint(node) or any(
        key in annotations for key in (CORDON_REASON_ANNOTATION, CORDON_UNSCHEDULABLE_ANNOTATION)
    )


def pod_name(spec: WorkerGroupSpec) -> str:
    """``<job>-<replica>-<hash of node and incarnation>``: a recreated or moved group
    gets a new pod, never one that clashes with its predecessor while that one ends."""
    return f"{local_name(spec.job)[:230]}-{spec.replica}-{group_digest(spec)}"


def host_network(template: dict[str, Any] | None, default: bool) -> bool:
    """Whether a job whose pod template is ``template`` runs on the host network: the
    template's ``spec.hostNetwork`` where it sets one, else ``default`` (the
    ``kube_host_network`` setting)."""
    chosen = _mapping(_mapping(template).get("spec")).get("hostNetwork")
    return chosen if isinstance(chosen, bool) else default


def worker_domain(job: str, namespace: str) -> str:
    """The DNS domain of a pod-network job's pods: ``<service>.<namespace>.svc``, which a
    pod's search path completes whatever the cluster's domain."""
    return f"{service_name(job)}.{namespace}.svc"


def owner_reference(training_job: dict[str, Any]) -> dict[str, Any]:
    """An owner reference to a TrainingJob (its pods and Service go with it)."""
    meta = training_job["metadata"]
    return {
        "apiVersion": training_job.get("apiVersion", f"{GROUP}/v1alpha1"),
        "kind": "TrainingJob",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


# The agent's NATS user, from a Secret (resurge.runtime.settings: nats_user, nats_password).
_NATS_USER = "RESURGE_NATS_USER"
_NATS_PASSWORD = "RESURGE_NATS_PASSWORD"
_NATS_CREDS = "RESURGE_NATS_CREDS"
_NATS_USER_SETTINGS = (_NATS_USER, _NATS_PASSWORD, _NATS_CREDS, "RESURGE_NATS_CREDENTIALS")


def pod_manifest(
    spec: WorkerGroupSpec,
    training_job: dict[str, Any] | None,
    agent_env: dict[str, str],
    default_image: str,
    agent_secret: str | None = None,
    creds_secret: str | None = None,
) -> dict[str, Any]:
    """The pod of worker group ``spec``.

    The TrainingJob's ``spec.template`` is the starting point (its first container
    becomes the agent's); resurge sets the name, labels, node affinity, the count of
    the job's accelerator, command and environment over it, and its networking (the
    module docstring: the group's ``domain`` decides). ``agent_env`` is the
    agent's connection settings; ``agent_secret`` names the Secret whose ``user`` and
    ``password`` keys are the agent role's NATS user (``RESURGE_NATS_USER`` and
    ``RESURGE_NATS_PASSWORD``); ``creds_secret`` instead names the Secret whose ``creds``
    key is the pod's own user (``RESURGE_NATS_CREDS``, :mod:`.pod_credentials`)."""
    job_spec = (training_job or {}).get("spec") or {}
    template = copy.deepcopy(job_spec.get("template") or {})
    meta = template.get("metadata") or {}
    pod_spec = template.get("spec") or {}
    labels = dict(meta.get("labels") or {})
    labels.update({JOB_LABEL: local_name(spec.job), REPLICA_LABEL: str(spec.replica)})
    # A queued job is one Kueue workload (.queueing); a pod with the queue label would be
    # one more, of its own, to Kueue's pod integration.
    labels.pop(QUEUE_LABEL, None)
    annotations = dict(meta.get("annotations") or {})
    annotations[GROUP_ANNOTATION] = spec.model_dump_json()
    containers = list(pod_spec.get("containers") or [{}])
    container = dict(containers[0])
    image = job_spec.get("image") or container.get("image") or default_image
    container.update(
        {
            "name": container.get("name") or CONTAINER,
            "image": image,
            "command": ["resurge-node-agent", "launch"],
            "env": _agent_env(
                container.get("env") or [], spec, agent_env, agent_secret, creds_secret
            ),
            "resources": _with_accelerator(
                container.get("resources") or {}, job_accelerator(job_spec), spec.nproc
            ),
        }
    )
    container.pop("args", None)
    _with_memory_folder(pod_spec, container)
    pod_spec.update(
        {
            "containers": [container, *containers[1:]],
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": int(spec.stop_grace_seconds) + 5,
            "affinity": _pinned(_mapping(pod_spec.get("affinity")), spec.node),
        }
    )
    _network(pod_spec, spec)
    # Last: a template's own toleration of a taint is the one the taint manager reads.
    tolerations = [t for t in pod_spec.get("tolerations") or [] if isinstance(t, dict)]
    pod_spec["tolerations"] = [*tolerations, no_execute_toleration(job_spec)]
    if job_spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = job_spec["priorityClassName"]
    metadata: dict[str, Any] = {
        "name": pod_name(spec),
        "labels": labels,
        "annotations": annotations,
    }
    if training_job is not None:
        metadata["ownerReferences"] = [owner_reference(training_job)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


SHM_VOLUME = "resurge-shm"


def _with_memory_folder(pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    """Mount a memory-backed ``emptyDir`` at ``/dev/shm`` in the agent's container, unless
    the template mounts something there: the node memory protected state is snapshotted
    into (and that DataLoader workers share tensors through), which a container runtime
    otherwise caps at 64 MiB. It counts against the pod's memory, and goes with the pod."""
    mounts = list(container.get("volumeMounts") or [])
    if any(mount.get("mountPath") == "/dev/shm" for mount in mounts):
        return
    container["volumeMounts"] = [*mounts, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    volumes = list(pod_spec.get("volumes") or [])
    pod_spec["volumes"] = [*volumes, {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}]


def _agent_env(
    env: list[dict[str, Any]],
    spec: WorkerGroupSpec,
    agent_env: dict[str, str],
    agent_secret: str | None,
    creds_secret: str | None,
) -> list[dict[str, Any]]:
    """The template container's ``env`` with the agent's over it: its connection
    settings, its NATS user from ``creds_secret`` or ``agent_secret`` (if any) and its
    worker group."""
    env = [e for e in env if e.get("name") not in agent_env]
    env += [{"name": k, "value": v} for k, v in sorted(agent_env.items())]
    secret_env: dict[str, tuple[str, str]] = {}
    if creds_secret:
        secret_env = {_NATS_CREDS: (creds_secret, "creds")}
    elif agent_secret:
        secret_env = {
            _NATS_USER: (agent_secret, "user"),
            _NATS_PASSWORD: (agent_secret, "password"),
        }
    if secret_env:  # the template's own user settings would win over the Secret's
        env = [e for e in env if e.get("name") not in _NATS_USER_SETTINGS]
    env += [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for name, (secret, key) in secret_env.items()
    ]
    env = [e for e in env if e.get("name") != WORKER_GROUP_ENV]
    env.append({"name": WORKER_GROUP_ENV, "value": spec.model_dump_json()})
    return env


def _with_accelerator(
    resources: dict[str, Any], accelerator: str | None, count: int
) -> dict[str, Any]:
    """A copy of a container's ``resources`` requesting and limited to ``count`` devices
    of ``accelerator`` (what the template wrote for it replaced); as it is where the job
    has no accelerator."""
    resources = copy.deepcopy(resources)
    if accelerator is not None:
        for kind in ("requests", "limits"):
            resources.setdefault(kind, {})[accelerator] = str(count)
    return resources


def _pinned(affinity: dict[str, Any], node: str) -> dict[str, Any]:
    """The template's ``affinity`` with the pin to Node ``node`` ANDed into each of its
    required node affinity's terms (:func:`with_required`): every term it had still
    holds on the chosen node."""
    return with_required(affinity, [{"key": "metadata.name", "operator": "In", "values": [node]}])


def with_required(affinity: dict[str, Any], fields: list[dict[str, Any]]) -> dict[str, Any]:
    """A copy of ``affinity`` (a pod's) whose required node affinity also holds
    ``fields`` (``matchFields`` requirements): they are ANDed into each of its
    ``nodeSelectorTerms`` (which stay ORed); with none, they are the one term.
    Everything else (preferred terms, pod affinity) is kept as written."""
    affinity = copy.deepcopy(affinity)
    node_affinity = _mapping(affinity.get("nodeAffinity"))
    required = _mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = _objects(required.get("nodeSelectorTerms")) or [{}]
    merged = [
        {**term, "matchFields": [*_objects(term.get("matchFields")), *fields]} for term in terms
    ]
    affinity["nodeAffinity"] = {
        **node_affinity,
        "requiredDuringSchedulingIgnoredDuringExecution": {**required, "nodeSelectorTerms": merged},
    }
    return affinity


def _network(pod_spec: dict[str, Any], spec: WorkerGroupSpec) -> None:
    """Put the pod on the host network (the group has no ``domain``) or on the pod
    network, named under its job's headless Service."""
    if spec.domain is None:
        pod_spec["hostNetwork"] = True
        pod_spec.setdefault("dnsPolicy", "ClusterFirstWithHostNet")
    else:
        pod_spec.pop("hostNetwork", None)  # at most false: the job got a domain for it
        pod_spec["hostname"] = worker_hostname(spec)
        pod_spec["subdomain"] = service_name(local_name(spec.job))


def group_of_pod(pod: dict[str, Any]) -> WorkerGroupSpec | None:
    """The worker group a pod runs; None for a pod that is not one."""
    text = _mapping(_mapping(pod.get("metadata")).get("annotations")).get(GROUP_ANNOTATION)
    if not text or not isinstance(text, str):
        return None
    try:
        return WorkerGroupSpec.model_validate(json.loads(text))
    except (ValueError, RecursionError):  # bad JSON, or nested past the parser's depth
        return None


def job_service(job: str, training_job: dict[str, Any] | None) -> dict[str, Any]:
    """The job's headless Service: stable DNS names for its pods."""
    metadata: dict[str, Any] = {"name": service_name(job), "labels": {JOB_LABEL: job}}
    if training_job is not None:
        metadata["ownerReferences"] = [owner_reference(training_job)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: job},
            "publishNotReadyAddresses": True,
        },
    }
