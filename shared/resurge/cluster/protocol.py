"""The cluster-backend protocol (DESIGN section 6) and the records it trades in.

Every service and the CLI act on a cluster only through :class:`ClusterBackend`:
they list nodes, create or delete the worker group of (job, replica) on a node, cordon
and uncordon nodes, write a job's status, and learn of node and worker-group changes.
``local`` keeps all of it as JetStream KV records that each virtual node's monitor
reconciles, the way a kubelet reconciles pods; the Kubernetes backend maps worker
groups to pods, nodes to Node objects and the status to the TrainingJob's status
subresource. :func:`resurge.cluster.open_backend` picks one by settings.

A backend that cannot reach its cluster raises :class:`BackendError` (or the client
library's own error) from any method; callers retry as they retry a bus call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from resurge.jobspec import TrainingJob

__all__ = [
    "NODE_TIMEOUT_SECONDS",
    "BackendError",
    "ClusterBackend",
    "ClusterChange",
    "NodeInfo",
    "Taint",
    "UnknownNodeError",
    "WorkerGroupSpec",
]

# A node whose monitor (or kubelet) has not written for this long is not live: it gets
# no new work (:meth:`ClusterBackend.live_nodes`).
NODE_TIMEOUT_SECONDS = 15.0


WORKER_GROUP_ENV = "RESURGE_WORKER_GROUP"
"""The variable that hands a worker group's agent its :class:`WorkerGroupSpec` as JSON
(a pod's environment; the local monitor's launch)."""


class BackendError(RuntimeError):
    """The backend could not do what was asked (its cluster is unreachable, a write was
    refused); the message says which call and why."""


class UnknownNodeError(BackendError, LookupError):
    """No node by that name; the message lists the nodes the backend knows."""


class Taint(BaseModel):
    """A node taint (Kubernetes): pods that do not tolerate it are not placed there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(description="Taint key.")
    value: str = Field(default="", description="Taint value.")
    effect: str = Field(description="NoSchedule, PreferNoSchedule or NoExecute.")


class NodeInfo(BaseModel):
    """A node as its monitor agent (or kubelet) reports it, cordons applied."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Node name.")
    slots: int = Field(ge=0, description="GPUs (or simulated GPUs) a worker group can use.")
    healthy: bool = Field(default=True, description="False when the node should get no work.")
    cordoned: bool = Field(default=False, description="True when no new work may be placed.")
    cordon_reason: str = Field(default="", description="Why it was cordoned, in words.")
    address: str = Field(default="127.0.0.1", description="Address workers on it are reached at.")
    labels: dict[str, str] = Field(default_factory=dict, description="Node labels.")
    taints: list[Taint] = Field(
        default_factory=list, description="Node taints (Kubernetes; none locally)."
    )
    in_use_elsewhere: int = Field(
        default=0,
        ge=0,
        description="Slots taken by pods resurge did not create (Kubernetes: what other "
        "pods bound to the node request of the accelerator resource); never offered.",
    )
    heartbeat: datetime = Field(
        default_factory=lambda: datetime.now(UTC), description="When its monitor last wrote."
    )
    gpu_monitoring: Literal["nvml", "simulated", "none"] | None = Field(
        default=None,
        description="How its monitor watches its GPUs: 'nvml' (real ones), 'simulated' "
        "(made-up ones, which take injected XIDs), 'none' (no NVML: no XID or GPU health "
        "is watched); None where no monitor said (a node as the cluster lists it).",
    )

    def alive(self, now: datetime, timeout_seconds: float) -> bool:
        """Whether its monitor wrote within ``timeout_seconds`` of ``now``."""
        return (now - self.heartbeat).total_seconds() <= timeout_seconds

    @property
    def schedulable(self) -> bool:
        """Healthy and not cordoned: new work may be placed on it."""
        return self.healthy and not self.cordoned


class WorkerGroupSpec(BaseModel):
    """What a node runs for one replica of one job (a pod; locally one node agent).

    The agent receives this document whole and starts one generation of ``nproc``
    worker processes after another from it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str = Field(description="Job name.")
    replica: int = Field(ge=0, description="Replica index.")
    node: str = Field(description="Node that runs it.")
    nproc: int = Field(ge=1, description="Worker processes (slots it takes).")
    command: list[str] = Field(min_length=1, description="Worker argv.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra worker environment.")
    working_dir: str | None = Field(default=None, description="Folder the workers start in.")
    stop_grace_seconds: float = Field(default=10.0, gt=0, description="SIGTERM to SIGKILL.")
    fork_server: bool = Field(default=True, description="Fork workers from a pre-warmed server.")
    preload: list[str] = Field(
        default_factory=lambda: ["torch"], description="Modules the fork server imports."
    )  # the scaler copies spec.preloadModules here
    incarnation: int = Field(
        default=0, ge=0, description="Bumped to recreate the group (a pod-level restart)."
    )
    uid: str = Field(
        default="",
        description="The job run it serves (the job record's uid): its agent takes only "
        "this run's commands. Empty: any run's.",
    )
    checkpoint_dir: str | None = Field(
        default=None,
        description="The job's spec.checkpoint.dir; none: a folder of the job's own "
        "(resurge.worker.environment.default_checkpoint_dir).",
    )
    checkpoint_interval_steps: int | None = Field(
        default=None, ge=1, description="The job's spec.checkpoint.intervalSteps."
    )
    checkpoint_interval_seconds: float | None = Field(
        default=None, gt=0, description="The job's spec.checkpoint.intervalSeconds."
    )
    memory_interval_steps: int | None = Field(
        default=None, ge=1, description="The job's spec.checkpoint.memoryIntervalSteps."
    )
    memory_budget_bytes: int | None = Field(
        default=None, ge=1, description="The job's spec.checkpoint.memoryBudget, in bytes."
    )
    domain: str | None = Field(
        default=None,
        description="The DNS domain it is reached under, at <hostname>.<domain> (the job "
        "record's worker_domain: on Kubernetes its pod is on the pod network, a DNS name "
        "through the job's Service). None: at its node's address (local; on Kubernetes "
        "its pod is on the host network).",
    )


class ClusterChange(BaseModel):
    """One change :meth:`ClusterBackend.watch` reports: a node or a worker group was
    written (``deleted`` false, with its new value) or removed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["node", "worker_group"]
    deleted: bool = False
    node: str = Field(description="The node, or the node the worker group is on.")
    job: str | None = Field(default=None, description="A worker group's job.")
    replica: int | None = Field(default=None, description="A worker group's replica.")
    node_info: NodeInfo | None = Field(default=None, description="A written node.")
    worker_group: WorkerGroupSpec | None = Field(default=None, description="A written group.")


@runtime_checkable
class ClusterBackend(Protocol):
    """Where jobs run. Every method may raise :class:`BackendError` when the cluster
    cannot be reached; each says below what else it raises."""

    name: str
    """``local`` or ``kubernetes``: what ``RESURGE_CLUSTER`` chose."""

    launches_worker_groups: bool
    """True where each node's monitor starts the worker groups placed on its node
    (local); False where the cluster does (Kubernetes: the kubelet runs their pods)."""

    def worker_domain(self, job: TrainingJob) -> str | None:
        """The DNS domain under which ``job``'s worker groups are reached, each at
        ``<its hostname>.<domain>`` (:func:`resurge.cluster.names.worker_hostname`); None
        where they are reached at their node's address (:attr:`NodeInfo.address`).
        Kubernetes: the job's Service in the backend's namespace for a job on the pod
        network, None on the host network; local: None. Pure: no I/O."""
        ...

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node known, with slots, health, labels and cordon. Read-only."""
        ...

    async def live_nodes(self) -> list[NodeInfo]:
        """The nodes of :meth:`list_nodes` whose heartbeat is at most
        ``NODE_TIMEOUT_SECONDS`` old. Read-only."""
        ...

    async def report_node(self, info: NodeInfo) -> None:
        """Write a node's own record (its monitor's heartbeat), keeping any cordon the
        control plane set. Idempotent: the last write wins."""
        ...

    async def list_worker_groups(self, job: str | None = None) -> list[WorkerGroupSpec]:
        """Every worker group, or only ``job``'s. Read-only."""
        ...

    async def create_worker_group(self, spec: WorkerGroupSpec) -> None:
        """Create the group of (``spec.job``, ``spec.replica``) on ``spec.node``, or
        replace it; a new ``incarnation`` recreates its processes. Idempotent."""
        ...

    async def delete_worker_group(self, job: str, replica: int, node: str) -> None:
        """Remove that group and end its processes. Idempotent: an absent one is fine."""
        ...

    async def cordon(self, node: str, reason: str = "") -> None:
        """Let no new work onto ``node`` (unschedulable, unhealthy, ``reason`` kept).
        Idempotent: a second cordon keeps the first reason. Raises
        :class:`UnknownNodeError`."""
        ...

    async def uncordon(self, node: str) -> None:
        """Undo :meth:`cordon`. Idempotent. Raises :class:`UnknownNodeError`."""
        ...

    async def write_job_status(self, job: str, status: dict[str, object]) -> None:
        """Replace ``job``'s status (the ``resurge status --json`` object). Idempotent."""
        ...

    async def read_job_status(self, job: str) -> dict[str, object] | None:
        """The status last written for ``job``; None if none was. Read-only."""
        ...

    def unfit_nodes(self, job: TrainingJob, nodes: Iterable[NodeInfo]) -> dict[str, str]:
        """The nodes of ``nodes`` where ``job``'s worker groups may not be placed, each
        with why in words: Kubernetes: those its template's ``nodeSelector``, required
        node affinity or tolerations keep its pods from
        (:func:`resurge.cluster.kubernetes.scheduling.unfit_reason`); local: none (a
        template is Kubernetes-only). Pure: no I/O."""
        ...

    def watch(self, node: str | None = None) -> AsyncIterator[ClusterChange]:
        """Every node and worker group as it is now, then each change as it happens;
        with ``node``, only that node and the groups on it. Never ends by itself."""
        ...

    async def reconcile(self, *also: Callable[[], Awaitable[None]]) -> None:
        """Keep the cluster in line with the backend's records until cancelled (the
        scaler runs it): Kubernetes turns worker groups into pods and TrainingJobs into
        job submissions; local has nothing to do and waits to be cancelled (each
        node's monitor does its part). Each of ``also`` (the other parts that must
        have one writer, such as the scaler's status writer) runs beside it, afresh
        each time it starts. The scaler runs it as a supervised loop: it is started
        again if it raises (so is each of ``also``), and a return counts as a dead loop.
        Safe to run in more than one process at a time: on Kubernetes only the process
        holding the Lease ``kube_lease_name`` runs it and ``also``, the others wait to
        take the Lease over (:mod:`resurge.cluster.kubernetes.leader`)."""
        ...
