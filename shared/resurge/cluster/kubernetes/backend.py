"""The Kubernetes backend: Nodes, cordons and taints, TrainingJob status and Events
through the official ``kubernetes`` client; worker groups realised as pods.

- Nodes are the cluster's Node objects (:func:`~.objects.node_info`), read from one
  cache per process (:mod:`.informer`: one list, then one watch, shared with the
  controller's Node loop); a node is live while its kubelet says Ready and its resurge
  monitor renewed the node's Lease (:mod:`.node_lease`, also cached) within
  ``NODE_TIMEOUT_SECONDS``. What the cluster's other pods (any namespace, not finished,
  bound to the node) request of the accelerator is the node's ``in_use_elsewhere``
  (:func:`~.scheduling.in_use`, from a cache of those pods), never offered to a job;
  :meth:`unfit_nodes` are the nodes a job's template keeps its pods from
  (:func:`~.scheduling.unfit_reason`). :meth:`report_node` renews that Lease every few
  seconds and writes the monitor's report to the Node's annotation only when it
  changes; on a cluster where no kubelet registered the node (an emulator) it
  registers it.
- :meth:`cordon` sets ``spec.unschedulable``, the ``resurge.dev/unhealthy=true:
  NoSchedule`` taint and the reason; :meth:`uncordon` removes what resurge added (the
  unschedulable flag only where resurge set it). Both patch the node as read, with its
  resourceVersion as a precondition, and make the patch anew from a fresh read when it
  is refused (409), so a taint another controller adds meanwhile is never lost.
- Worker groups and job statuses are kept as the local backend keeps them (JetStream
  KV records: every write a compare-free put, watched by whoever needs them); the
  controller (:meth:`reconcile`, run by the scaler, :mod:`.controller`) turns
  each group into a pod and follows TrainingJobs into job submissions. A job's status is
  also written into its TrainingJob's status subresource (read, merge-patched with the
  resourceVersion as a precondition, read again on a conflict: :mod:`.status`), and each
  recovery and resize becomes a Kubernetes Event on it. A job whose TrainingJob asks for
  demand pods has them while it waits for room (:mod:`.demand`).
- The client is synchronous; every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from resurge.cluster.kubernetes.api import MERGE_PATCH, KubeApi, api_client, conflict, json_of
from resurge.cluster.kubernetes.controller import Controller
from resurge.cluster.kubernetes.demand import demand_pods, waits_for_room, wants_demand_pods
from resurge.cluster.kubernetes.gpu_health import (
    GpuCondition,
    condition_patch,
    gpu_condition,
    node_condition,
    node_event,
)
from resurge.cluster.kubernetes.identity import parse_namespaces
from resurge.cluster.kubernetes.informer import Informer, informer
from resurge.cluster.kubernetes.leader import LeaderElector, leading_gauge
from resurge.cluster.kubernetes.node_lease import (
    NODE_LABEL,
    holder,
    lease_manifest,
    lease_name,
    renew,
    renewed_at,
)
from resurge.cluster.kubernetes.objects import (
    DEMAND_LABEL,
    JOB_LABEL,
    MONITOR_ANNOTATION,
    UNHEALTHY_TAINT,
    MonitorReport,
    cordon_patch,
    host_network,
    monitor_report,
    node_info,
    node_manifest,
    node_ready,
    owner_reference,
    report_patch,
    resurge_cordon,
    uncordon_patch,
    worker_domain,
)
from resurge.cluster.kubernetes.scheduling import in_use, unfit_reason
from resurge.cluster.kubernetes.status import StatusUpdate, event_manifests, status_update
from resurge.cluster.kubernetes.times import parse_time
from resurge.cluster.kubernetes.watch import SYNCED, drain
from resurge.cluster.local.backend import LocalBackend
from resurge.cluster.local.watch import watch_changes
from resurge.cluster.protocol import (
    NODE_TIMEOUT_SECONDS,
    BackendError,
    ClusterBackend,
    ClusterChange,
    NodeInfo,
    UnknownNodeError,
    WorkerGroupSpec,
)
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from resurge.runtime.together import together

if TYPE_CHECKING:
    from resurge.cluster.kubernetes.pod_credentials import PodUsers
    from resurge.jobspec import TrainingJob

__all__ = ["KubernetesBackend"]

log = logging.getLogger("resurge.cluster.kubernetes")

# A node's Lease is renewed this often (a third of the time it stays live unrenewed).
_HEARTBEAT_WRITE_SECONDS = NODE_TIMEOUT_SECONDS / 3
# A write refused as stale (409) is made again from a fresh read at most this many times.
_WRITE_TRIES = 8
# The pods whose requests count against their node: those not finished (the field
# selector of kube-scheduler's own pod informer).
_UNFINISHED_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class KubernetesBackend:
    """The :class:`~resurge.cluster.protocol.ClusterBackend` of a Kubernetes cluster."""

    name: str = "kubernetes"
    launches_worker_groups: bool = False

    def __init__(self, bus: Bus, records: LocalBackend, kube: KubeApi, settings: Settings):
        self.bus = bus
        self.records = records
        self.kube = kube
        self.settings = settings
        self.namespace = kube.namespace
        self.pod_users: PodUsers | None = None  # (.pod_credentials), set by open
        self._reported: dict[str, NodeInfo] = {}  # the last report written, by node
        self._renewed: dict[str, datetime] = {}  # the heartbeat of the last renewal
        self._leases: dict[str, dict[str, Any]] = {}  # each node's Lease as last written
        self._gpu_said: dict[str, GpuCondition] = {}  # the GPU condition written, by node
        # The informers, once this backend reads through them (a monitor never does: it
        # writes its own Node and Lease and watches nothing).
        self._nodes: Informer | None = None
        self._node_leases: Informer | None = None
        # What other pods take of each node, with the pod cache's state it is from.
        self._in_use: tuple[tuple[int, int], dict[str, int]] | None = None
        # Whether each job's demand pods are there, as this process last made them.
        self._demand: dict[str, bool] = {}
        # Each node's NodeInfo as last read, with the Node's resourceVersion and the
        # Lease's renewal it was read from: read again only when either changed.
        self._infos_read: dict[str, tuple[str, datetime | None, NodeInfo]] = {}

    @classmethod
    async def open(
        cls, bus: Bus, settings: Settings, pod_users: PodUsers | None = None
    ) -> KubernetesBackend:
        """The backend of the cluster :func:`api_client` finds, keeping its records on
        ``bus``'s server; its controller gives pods users of ``pod_users``
        (:mod:`.pod_credentials`), if given. Raises :class:`BackendError` when no cluster
        is configured."""
        try:
            api = await asyncio.to_thread(api_client)
        except Exception as error:  # no service account, no kubeconfig
            raise BackendError(
                f"RESURGE_CLUSTER=kubernetes: no cluster to talk to ({error}); run inside a "
                "pod with a service account, or set KUBECONFIG"
            ) from error
        served = parse_namespaces(settings.kube_namespaces)
        kube = KubeApi(api, settings.kube_namespace, served)
        backend = cls(bus, await LocalBackend.open(bus), kube, settings)
        backend.pod_users = pod_users
        return backend

    # -- nodes ----------------------------------------------------------------------------

    def _node_informer(self) -> Informer:
        """This process's one cache of the Nodes (:mod:`.informer`)."""
        self._nodes = informer(self.kube, self.kube.core.list_node)
        return self._nodes

    def _lease_informer(self) -> Informer:
        """This process's one cache of the nodes' Leases (:mod:`.node_lease`)."""
        self._node_leases = informer(
            self.kube,
            self.kube.coordination.list_namespaced_lease,
            namespace=self.namespace,
            label_selector=NODE_LABEL,
        )
        return self._node_leases

    def _pod_informer(self) -> Informer:
        """This process's one cache of the cluster's unfinished pods, anyone's."""
        return informer(
            self.kube,
            self.kube.core.list_pod_for_all_namespaces,
            field_selector=_UNFINISHED_PODS,
        )

    async def _in_use_elsewhere(self) -> dict[str, int]:
        """What pods resurge did not create take of each node's accelerator (worked out
        again only when the pod cache changed)."""
        informer_ = self._pod_informer()
        pods = await informer_.objects()
        if self._in_use is None or self._in_use[0] != (id(informer_), informer_.changes_seen):
            found = in_use(pods, self.settings.kube_accelerator)
            self._in_use = ((id(informer_), informer_.changes_seen), found)
        return self._in_use[1]

    def _wrote_node(self, node: dict[str, Any]) -> None:
        """Show a Node as a write returned it to this backend's reads (if it has read)."""
        if self._nodes is not None:
            self._nodes.written(node)

    async def _infos(self) -> list[tuple[dict[str, Any], NodeInfo]]:
        """Every cached Node with its NodeInfo, heartbeats from the cached Leases."""
        nodes = await self._node_informer().objects()
        renewed = {
            name: when
            for lease in await self._lease_informer().objects()
            if (name := holder(lease)) is not None and (when := renewed_at(lease)) is not None
        }
        read, self._infos_read = self._infos_read, {}
        infos = []
        for node in nodes:
            name = _node_name(node)
            when = renewed.get(name)
            meta = node.get("metadata") or {}
            version = str(meta.get("resourceVersion") or "")
            last = read.get(name)
            if last is not None and last[:2] == (version, when):
                info = last[2]
            else:
                info = node_info(node, when, self.settings.kube_accelerator)
            # Not kept where node_info stamps the heartbeat now (nothing in the Node dates
            # it): every read would stamp it anew.
            if version and (when is not None or parse_time(meta.get("creationTimestamp"))):
                self._infos_read[name] = (version, when, info)
            infos.append((node, info))
        taken = await self._in_use_elsewhere()
        return [
            (node, info.model_copy(update={"in_use_elsewhere": taken[info.name]}))
            if taken.get(info.name)
            else (node, info)
            for node, info in infos
        ]

    async def _node(self, name: str) -> dict[str, Any] | None:
        return await self.kube.read(f"read node {name}", self.kube.core.read_node, name)

    async def list_nodes(self) -> list[NodeInfo]:
        """Every Node, as :func:`~.objects.node_info` reads it (from the cache)."""
        return [info for _, info in await self._infos()]

    async def live_nodes(self) -> list[NodeInfo]:
        """Nodes whose kubelet says Ready and whose monitor renewed the node's Lease
        within ``NODE_TIMEOUT_SECONDS`` (from the caches)."""
        now = datetime.now(UTC)
        return [
            info
            for node, info in await self._infos()
            if node_ready(node) and info.alive(now, NODE_TIMEOUT_SECONDS)
        ]

    async def report_node(self, info: NodeInfo) -> None:
        """Record the monitor's report on its Node (registering the Node where no kubelet
        did) when it differs from the last one written, and renew the node's Lease (the
        heartbeat) when one is due."""
        last = self._reported.get(info.name)
        if last is None or _report(last) != _report(info):
            await self._write_report(info, last)
        self._reported[info.name] = info
        renewed = self._renewed.get(info.name)
        if (
            renewed is None
            or (info.heartbeat - renewed).total_seconds() >= _HEARTBEAT_WRITE_SECONDS
            or info.heartbeat < renewed
        ):
            await self._renew_lease(info.name, info.heartbeat)
            self._renewed[info.name] = info.heartbeat
        if info.gpu_monitoring is not None:
            await self._say_gpu_health(info)

    async def _say_gpu_health(self, info: NodeInfo) -> None:
        """Set the Node's ``ResurgeGPUHealth`` condition where it changes, with an Event
        where its status or reason does (:mod:`.gpu_health`); nothing where the Node
        says it already (a restarted monitor)."""
        assert info.gpu_monitoring is not None
        wanted = gpu_condition(info.gpu_monitoring, info.healthy, info.slots)
        said = self._gpu_said.get(info.name)
        if said is None:
            said = node_condition(await self._node(info.name))
        if said == wanted:
            self._gpu_said[info.name] = wanted
            return
        await self.kube.call(
            f"set the GPU condition of node {info.name}",
            self.kube.core.patch_node_status,
            info.name,
            condition_patch(wanted),
            _preload_content=False,
        )
        self._gpu_said[info.name] = wanted
        if said is not None and said.key == wanted.key:
            return  # the same state in other words (another GPU count)
        with contextlib.suppress(BackendError):  # an Event is a courtesy, not state
            await self.kube.call(
                f"record an Event on node {info.name}",
                self.kube.core.create_namespaced_event,
                self.namespace,
                node_event(info.name, self.namespace, wanted),
                _preload_content=False,
            )

    async def _write_report(self, info: NodeInfo, last: NodeInfo | None) -> None:
        """Patch the report into the Node's annotation (read first when this process has
        not written it yet), or register the Node."""
        if last is None:
            node = await self._node(info.name)
            if node is None:
                try:
                    created = await self.kube.call(
                        f"register node {info.name}",
                        self.kube.core.create_node,
                        node_manifest(info),
                        _preload_content=False,
                    )
                except BackendError as error:
                    if not conflict(error):  # registered meanwhile: patch it below
                        raise
                    node = await self._node(info.name)
                else:
                    self._wrote_node(json_of(created))
                    return
            before = None if node is None else monitor_report(node)
            if before is not None and _report(before) == _report(info):
                return  # as this monitor (before a restart) left it
        else:
            node = {"metadata": {"annotations": {MONITOR_ANNOTATION: _report_json(last)}}}
        patched = await self.kube.call(
            f"patch node {info.name}",
            self.kube.core.patch_node,
            info.name,
            report_patch(node, info),
            _content_type=MERGE_PATCH,
            _preload_content=False,
        )
        self._wrote_node(json_of(patched))

    async def _renew_lease(self, node: str, when: datetime) -> None:
        """Renew ``node``'s Lease as renewed at ``when``: an update of the Lease last
        read or written (409: read it again), or its creation."""
        duration = int(NODE_TIMEOUT_SECONDS)
        name = lease_name(node)
        for _ in range(_WRITE_TRIES):
            lease = self._leases.get(node)
            try:
                if lease is None:
                    lease = await self._read_lease(name)
                if lease is None:
                    written = await self.kube.read(
                        f"create the Lease of node {node}",
                        self.kube.coordination.create_namespaced_lease,
                        self.namespace,
                        lease_manifest(node, when, duration),
                    )
                else:
                    written = await self.kube.read(
                        f"renew the Lease of node {node}",
                        self.kube.coordination.replace_namespaced_lease,
                        name,
                        self.namespace,
                        renew(lease, node, when, duration),
                    )
            except BackendError as error:
                if not conflict(error):  # another writer came first: read it again
                    raise
                written = None
            if written is None:  # 409, or deleted since read: create it
                self._leases.pop(node, None)
                continue
            self._leases[node] = written
            if self._node_leases is not None:
                self._node_leases.written(self._leases[node])
            return
        raise BackendError(f"the Lease of node {node} changed under each of {_WRITE_TRIES} writes")

    async def _read_lease(self, name: str) -> dict[str, Any] | None:
        return await self.kube.read(
            f"read Lease {name}",
            self.kube.coordination.read_namespaced_lease,
            name,
            self.namespace,
        )

    async def _known(self, name: str) -> dict[str, Any]:
        """Node ``name`` from the cache; :class:`UnknownNodeError` naming the cached ones
        if there is none."""
        nodes = self._node_informer()
        node = await nodes.get(name)
        if node is None:
            known = ", ".join(sorted(_node_name(n) for n in await nodes.objects())) or "none"
            raise UnknownNodeError(f"no node named {name!r} (nodes: {known})")
        return node

    async def _patch_node(
        self, what: str, name: str, patch: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> None:
        """Merge-patch node ``name`` with ``patch(node)`` (None: nothing to do), the node
        as cached first; the patch carries the node's resourceVersion, so when the node
        changed since (409) it is read again and the patch made anew from it."""
        node: dict[str, Any] | None = await self._known(name)
        for _ in range(_WRITE_TRIES):
            if node is None:
                await self._known(name)  # deleted meanwhile: UnknownNodeError
                return
            body = patch(node)
            if body is None:
                return
            try:
                patched = await self.kube.call(
                    f"{what} node {name}",
                    self.kube.core.patch_node,
                    name,
                    body,
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                )
            except BackendError as error:
                if not conflict(error):
                    raise
                node = await self._node(name)
                if node is not None:
                    self._wrote_node(node)
                continue
            self._wrote_node(json_of(patched))
            return
        raise BackendError(f"node {name} changed under each of {_WRITE_TRIES} {what} patches")

    async def cordon(self, node: str, reason: str = "") -> None:
        """Unschedulable plus the unhealthy taint, ``reason`` kept; a node cordoned by
        resurge already keeps its first reason. Taints others add meanwhile are kept."""

        def patch(current: dict[str, Any]) -> dict[str, Any] | None:
            if _tainted_unhealthy(current):
                return None
            return cordon_patch(current, reason)

        await self._patch_node("cordon", node, patch)

    async def uncordon(self, node: str) -> None:
        """Remove what :meth:`cordon` added: the unhealthy taint, the reason, and
        ``spec.unschedulable`` only if resurge set it (an administrator's own cordon
        stays)."""

        def patch(current: dict[str, Any]) -> dict[str, Any] | None:
            return uncordon_patch(current) if resurge_cordon(current) else None

        await self._patch_node("uncordon", node, patch)

    # -- worker groups (records; the controller makes them pods) ------------------------

    def worker_domain(self, job: TrainingJob) -> str | None:
        """The job's Service domain in its namespace, where its pods are on the pod
        network (:func:`~.objects.host_network` of its template and the settings); None
        on the host network, where a group is reached at its node's address."""
        if host_network(job.spec.template, self.settings.kube_host_network):
            return None
        return worker_domain(job.name, job.metadata.namespace)

    def unfit_nodes(self, job: TrainingJob, nodes: Iterable[NodeInfo]) -> dict[str, str]:
        """The nodes ``job``'s pods may not go to, each with why: its template's
        ``nodeSelector`` or required node affinity does not match the node, or the node
        has a taint the template does not tolerate (:func:`~.scheduling.unfit_reason`)."""
        template = job.spec.template
        spec = (template or {}).get("spec") or {}
        selects = bool(spec.get("nodeSelector")) or bool(
            ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            )
        )
        unfit = {}
        for node in nodes:
            if not selects and not node.taints:
                continue  # nothing to match: every such node may take its pods
            taints = [t.model_dump() for t in node.taints]
            why = unfit_reason(template, node.name, node.labels, taints)
            if why is not None:
                unfit[node.name] = why
        return unfit

    async def list_worker_groups(self, job: str | None = None) -> list[WorkerGroupSpec]:
        """Every worker group record, or only ``job``'s."""
        return await self.records.list_worker_groups(job)

    async def create_worker_group(self, spec: WorkerGroupSpec) -> None:
        """Write the group's record; the controller creates (or recreates) its pod."""
        await self.records.create_worker_group(spec)

    async def delete_worker_group(self, job: str, replica: int, node: str) -> None:
        """Delete the group's record; the controller deletes its pod. Absent is fine."""
        await self.records.delete_worker_group(job, replica, node)

    # -- job status ---------------------------------------------------------------------

    async def write_job_status(self, job: str, status: dict[str, object]) -> None:
        """Keep the status record, write it into the job's TrainingJob (if the job has
        one) and record what the write shows for the first time (a recovery, a resize,
        the end) as an Event.

        The TrainingJob is read and its status merge-patched with the resourceVersion
        read as a precondition, read again on a conflict (another writer won:
        :meth:`~.api.KubeApi.update_training_job_status`), so the Events come from the
        status the write replaced, whoever wrote it: each is recorded once, by the writer
        whose write made it new."""
        await self.records.write_job_status(job, status)
        tried: list[tuple[dict[str, Any], StatusUpdate]] = []

        def change(training_job: dict[str, Any]) -> dict[str, Any] | None:
            update = status_update(status, training_job)
            tried.append((training_job, update))
            return None if update.patch is None else update.patch["status"]

        written = await self.kube.update_training_job_status(job, change)
        if tried:
            with contextlib.suppress(BackendError):  # shown again at the next write
                await self._show_demand(job, tried[-1][0], status)
        if not written:
            return
        training_job, update = tried[-1]
        namespace = self.kube.locate(job)[0]
        for event in event_manifests(training_job, update.before, update.after):
            with contextlib.suppress(BackendError):  # an Event is a courtesy, not state
                await self.kube.call(
                    f"record an Event on {job}",
                    self.kube.core.create_namespaced_event,
                    namespace,
                    event,
                    _preload_content=False,
                )

    async def _show_demand(
        self, job: str, training_job: dict[str, Any], status: dict[str, object]
    ) -> None:
        """Keep ``job``'s demand pods (:mod:`.demand`): there while its TrainingJob asks
        for them and it waits for room, gone as soon as it does not (read from the API
        once per job and process, then known)."""
        wanted = wants_demand_pods(training_job) and waits_for_room(status)
        known = self._demand.get(job)
        if known == wanted or (
            known is None and not wanted and not wants_demand_pods(training_job)
        ):
            return
        meta = training_job.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or self.namespace), str(meta.get("name"))
        if wanted:
            avoid = status.get("avoidNodes")
            pods = demand_pods(
                training_job,
                {JOB_LABEL: name},
                owner_reference(training_job),
                self.settings.kube_image,
                [str(n) for n in avoid] if isinstance(avoid, list) else [],
            )
            for pod in pods:
                try:
                    await self.kube.call(
                        f"create demand pod {pod['metadata']['name']}",
                        self.kube.core.create_namespaced_pod,
                        namespace,
                        pod,
                        _preload_content=False,
                    )
                except BackendError as error:
                    if not conflict(error):  # there already: fine
                        raise
        else:
            listed = await self.kube.read(
                f"list the demand pods of {job}",
                self.kube.core.list_namespaced_pod,
                namespace,
                label_selector=f"{JOB_LABEL}={name},{DEMAND_LABEL}",
            )
            for pod in (listed or {}).get("items") or []:
                await self.kube.read(
                    f"delete demand pod {pod['metadata']['name']}",
                    self.kube.core.delete_namespaced_pod,
                    pod["metadata"]["name"],
                    namespace,
                )
        self._demand[job] = wanted

    async def read_job_status(self, job: str) -> dict[str, object] | None:
        """The status last written for ``job``."""
        return await self.records.read_job_status(job)

    async def training_job(self, job: str) -> dict[str, Any] | None:
        """The TrainingJob whose bus name is ``job`` (:mod:`.identity`); None if none is."""
        return await self.kube.training_job(job)

    # -- changes ------------------------------------------------------------------------

    async def watch(self, node: str | None = None) -> AsyncGenerator[ClusterChange, None]:
        """Nodes (from the process's Node informer, :mod:`.informer`) and worker group
        records now, then each change."""
        queue: asyncio.Queue[ClusterChange] = asyncio.Queue()
        synced = asyncio.Event()

        async def nodes() -> None:
            async with contextlib.aclosing(self._node_informer().changes()) as events:
                async for kind, obj in events:
                    await on_node(kind, obj)

        async def on_node(kind: str, obj: dict[str, Any]) -> None:
            if kind == SYNCED:
                synced.set()
            elif node is None or _node_name(obj) == node:
                await queue.put(_node_change(kind, obj, self.settings.kube_accelerator))

        async def groups() -> None:
            await synced.wait()  # the nodes as they are come first
            watched = watch_changes(None, None, self.records.groups, _no_node, node)
            async with contextlib.aclosing(watched) as changes:
                async for change in changes:
                    await queue.put(change)

        async with contextlib.aclosing(drain(queue, [nodes(), groups()])) as changes:
            async for change in changes:
                yield change

    async def reconcile(self, *also: Callable[[], Awaitable[None]]) -> None:
        """Run the controller (:mod:`.controller`) and ``also`` until cancelled, but only
        while this process holds the Lease (:mod:`.leader`): each time it comes to lead,
        afresh; each time it stops, cancelled."""
        settings = self.settings

        def lead() -> Awaitable[None]:  # a new controller each time
            users = self.pod_users
            return together(
                Controller(self.kube, self.bus, self.records, settings, users).run, *also
            )

        await LeaderElector(
            self.kube,
            settings.kube_lease_name,
            settings.kube_lease_seconds,
            on_change=leading_gauge(self.bus.registry, settings.kube_lease_name),
        ).run(lead)


def _report(info: NodeInfo | MonitorReport) -> tuple[object, ...]:
    """What a monitor's report says, its heartbeat aside."""
    return (info.slots, info.healthy, info.address, info.labels)


def _report_json(info: NodeInfo) -> str:
    return MonitorReport(
        slots=info.slots,
        healthy=info.healthy,
        address=info.address,
        labels=info.labels,
        heartbeat=info.heartbeat,
    ).model_dump_json()


def _tainted_unhealthy(node: dict[str, Any]) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return any(isinstance(t, dict) and t.get("key") == UNHEALTHY_TAINT for t in taints)


def _node_name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def _node_change(kind: str, obj: dict[str, Any], accelerator: str) -> ClusterChange:
    if kind == "DELETED":
        return ClusterChange(kind="node", deleted=True, node=_node_name(obj))
    info = node_info(obj, accelerator=accelerator)
    return ClusterChange(kind="node", node=_node_name(obj), node_info=info)


async def _no_node(name: str) -> NodeInfo | None:
    return None  # only worker groups are watched through the records


# mypy fails here when KubernetesBackend drifts from the protocol.
_CONFORMS: type[ClusterBackend] = KubernetesBackend
