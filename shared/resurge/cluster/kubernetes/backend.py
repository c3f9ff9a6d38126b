"""The Kubernetes backend: Nodes, cordons and taints, TrainingJob status and Events
through the official ``kubernetes`` client; worker groups realised as pods.

- Nodes are the cluster's Node objects (:func:`~.objects.node_info`); a
  node is live while its kubelet says Ready and its resurge monitor reported within
  ``NODE_TIMEOUT_SECONDS``. :meth:`report_node` records the monitor's report as an
  annotation (written when it changes, or every few seconds as a heartbeat); on a
  cluster where no kubelet registered the node (an emulator) it registers it.
- :meth:`cordon` sets ``spec.unschedulable``, the ``resurge.dev/unhealthy=true:
  NoSchedule`` taint and the reason; :meth:`uncordon` clears all three.
- Worker groups and job statuses are kept as the local backend keeps them (JetStream
  KV records: every write a compare-free put, watched by whoever needs them); the
  controller (:meth:`reconcile`, run by the scaler, :mod:`.controller`) turns
  each group into a pod and follows TrainingJobs into job submissions. A job's status is
  also written into its TrainingJob's status subresource (read, merge-patched with the
  resourceVersion as a precondition, retried on a conflict: :mod:`.status`), and each
  recovery and resize becomes a Kubernetes Event on it.
- The client is synchronous; every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from resurge.cluster.kubernetes.api import MERGE_PATCH, KubeApi, api_client, json_of, missing
from resurge.cluster.kubernetes.controller import Controller
from resurge.cluster.kubernetes.objects import (
    cordon_patch,
    node_info,
    node_manifest,
    node_ready,
    report_patch,
    uncordon_patch,
)
from resurge.cluster.kubernetes.status import event_manifests, status_update
from resurge.cluster.kubernetes.watch import SYNCED, drain, follow
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

__all__ = ["KubernetesBackend"]

log = logging.getLogger("resurge.cluster.kubernetes")

# A monitor's report that says nothing new is written at most this often.
_HEARTBEAT_WRITE_SECONDS = NODE_TIMEOUT_SECONDS / 3
# A status write that keeps losing to other writers gives up after this many tries.
_STATUS_WRITE_TRIES = 8


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
        self._reported: dict[str, NodeInfo] = {}

    @classmethod
    async def open(cls, bus: Bus, settings: Settings) -> KubernetesBackend:
        """The backend of the cluster :func:`api_client` finds, keeping its records on
        ``bus``'s server. Raises :class:`BackendError` when no cluster is configured."""
        try:
            api = await asyncio.to_thread(api_client)
        except Exception as error:  # no service account, no kubeconfig
            raise BackendError(
                f"RESURGE_CLUSTER=kubernetes: no cluster to talk to ({error}); run inside a "
                "pod with a service account, or set KUBECONFIG"
            ) from error
        kube = KubeApi(api, settings.kube_namespace)
        return cls(bus, await LocalBackend.open(bus), kube, settings)

    # -- nodes ----------------------------------------------------------------------------

    async def _nodes(self) -> list[dict[str, Any]]:
        listed = await self.kube.call(
            "list nodes", self.kube.core.list_node, _preload_content=False
        )
        return list(json_of(listed).get("items") or [])

    async def _node(self, name: str) -> dict[str, Any] | None:
        try:
            got = await self.kube.call(
                f"read node {name}", self.kube.core.read_node, name, _preload_content=False
            )
        except ApiException as error:
            if missing(error):
                return None
            raise
        return json_of(got)

    async def list_nodes(self) -> list[NodeInfo]:
        """Every Node, as :func:`~.objects.node_info` reads it."""
        return [node_info(node) for node in await self._nodes()]

    async def live_nodes(self) -> list[NodeInfo]:
        """Nodes whose kubelet says Ready and whose monitor wrote within
        ``NODE_TIMEOUT_SECONDS``."""
        now = datetime.now(UTC)
        return [
            info
            for node in await self._nodes()
            if node_ready(node) and (info := node_info(node)).alive(now, NODE_TIMEOUT_SECONDS)
        ]

    async def report_node(self, info: NodeInfo) -> None:
        """Record the monitor's report on its Node (registering the Node where no kubelet
        did); a report equal to the last one is written only as a heartbeat is due."""
        last = self._reported.get(info.name)
        if (
            last is not None
            and last.model_dump(exclude={"heartbeat"}) == info.model_dump(exclude={"heartbeat"})
            and (info.heartbeat - last.heartbeat).total_seconds() < _HEARTBEAT_WRITE_SECONDS
        ):
            return
        node = await self._node(info.name)
        if node is None:
            try:
                await self.kube.call(
                    f"register node {info.name}",
                    self.kube.core.create_node,
                    node_manifest(info),
                    _preload_content=False,
                )
            except ApiException as error:
                if error.status != 409:  # registered meanwhile: patch it below
                    raise
                node = await self._node(info.name)
            else:
                self._reported[info.name] = info
                return
        await self.kube.call(
            f"patch node {info.name}",
            self.kube.core.patch_node,
            info.name,
            report_patch(node, info),
            _content_type=MERGE_PATCH,
            _preload_content=False,
        )
        self._reported[info.name] = info

    async def _known(self, name: str) -> dict[str, Any]:
        node = await self._node(name)
        if node is None:
            known = ", ".join(sorted(n.name for n in await self.list_nodes())) or "none"
            raise UnknownNodeError(f"no node named {name!r} (nodes: {known})")
        return node

    async def cordon(self, node: str, reason: str = "") -> None:
        """Unschedulable plus the unhealthy taint, ``reason`` kept; a node cordoned by
        resurge already keeps its first reason."""
        current = await self._known(node)
        if node_info(current).cordoned and any(
            t.get("key") == "resurge.dev/unhealthy"
            for t in (current.get("spec") or {}).get("taints") or []
        ):
            return
        await self.kube.call(
            f"cordon node {node}",
            self.kube.core.patch_node,
            node,
            cordon_patch(current, reason),
            _content_type=MERGE_PATCH,
            _preload_content=False,
        )

    async def uncordon(self, node: str) -> None:
        """Clear unschedulable, the unhealthy taint and the reason."""
        current = await self._known(node)
        await self.kube.call(
            f"uncordon node {node}",
            self.kube.core.patch_node,
            node,
            uncordon_patch(current),
            _content_type=MERGE_PATCH,
            _preload_content=False,
        )

    # -- worker groups (records; the controller makes them pods) ------------------------

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

        The TrainingJob is read, its status merge-patched with the resourceVersion read
        as a precondition, and read again on a conflict (another writer won), so the
        Events come from the status the write replaced, whoever wrote it: each is
        recorded once, by the writer whose write made it new."""
        await self.records.write_job_status(job, status)
        for _ in range(_STATUS_WRITE_TRIES):
            training_job = await self.training_job(job)
            if training_job is None:
                return
            update = status_update(status, training_job)
            if update.patch is None:
                return
            try:
                await self.kube.patch_training_job_status(job, update.patch)
            except BackendError as error:
                if _conflict(error):
                    continue
                raise
            for event in event_manifests(training_job, update.before, update.after):
                with contextlib.suppress(BackendError):  # an Event is a courtesy, not state
                    await self.kube.call(
                        f"record an Event on {job}",
                        self.kube.core.create_namespaced_event,
                        self.namespace,
                        event,
                        _preload_content=False,
                    )
            return
        raise BackendError(
            f"the status of TrainingJob {job} changed under each of {_STATUS_WRITE_TRIES} writes"
        )

    async def read_job_status(self, job: str) -> dict[str, object] | None:
        """The status last written for ``job``."""
        return await self.records.read_job_status(job)

    async def training_job(self, job: str) -> dict[str, Any] | None:
        """The TrainingJob named ``job`` in the backend's namespace; None if none is."""
        return await self.kube.training_job(job)

    # -- changes ------------------------------------------------------------------------

    async def watch(self, node: str | None = None) -> AsyncGenerator[ClusterChange, None]:
        """Nodes (from a Node watch that resumes and relists, :mod:`.watch`)
        and worker group records now, then each change."""
        selector = {} if node is None else {"field_selector": f"metadata.name={node}"}
        queue: asyncio.Queue[ClusterChange] = asyncio.Queue()
        synced = asyncio.Event()

        async def nodes() -> None:
            async with contextlib.aclosing(follow(self.kube.core.list_node, **selector)) as events:
                async for kind, obj in events:
                    await on_node(kind, obj)

        async def on_node(kind: str, obj: dict[str, Any]) -> None:
            if kind == SYNCED:
                synced.set()
            elif node is None or _node_name(obj) == node:
                await queue.put(_node_change(kind, obj))

        async def groups() -> None:
            await synced.wait()  # the nodes as they are come first
            watched = watch_changes(None, None, self.records.groups, _no_node, node)
            async with contextlib.aclosing(watched) as changes:
                async for change in changes:
                    await queue.put(change)

        async with contextlib.aclosing(drain(queue, [nodes(), groups()])) as changes:
            async for change in changes:
                yield change

    async def reconcile(self) -> None:
        """Run the controller until cancelled (:mod:`.controller`)."""
        await Controller(self.kube, self.bus, self.records, self.settings).run()


def _conflict(error: BackendError) -> bool:
    """Whether ``error`` is the API server's 409: the precondition failed."""
    cause = error.__cause__
    return isinstance(cause, ApiException) and cause.status == 409


def _node_name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name"))


def _node_change(kind: str, obj: dict[str, Any]) -> ClusterChange:
    if kind == "DELETED":
        return ClusterChange(kind="node", deleted=True, node=_node_name(obj))
    return ClusterChange(kind="node", node=_node_name(obj), node_info=node_info(obj))


async def _no_node(name: str) -> NodeInfo | None:
    return None  # only worker groups are watched through the records


# mypy fails here when KubernetesBackend drifts from the protocol.
_CONFORMS: type[ClusterBackend] = KubernetesBackend
