"""The local backend: nodes, cordons, worker groups and job statuses as JetStream KV records.

Bucket ``<ns>_nodes`` holds one :class:`NodeInfo` per virtual node (written by its
monitor agent through :meth:`LocalBackend.report_node`); bucket ``<ns>_cordons`` one
:class:`Cordon` per cordoned node (written by the control plane, so a monitor's
heartbeat never undoes it, as a kubelet never undoes ``spec.unschedulable``); bucket
``<ns>_workergroups`` one :class:`WorkerGroupSpec` per (node, job, replica), which the
node's monitor agent watches and turns into ``resurge-node-agent launch`` processes;
bucket ``<ns>_jobstatus`` one status object per job. Keys: :mod:`resurge.cluster.local.keys`.

:class:`LocalBackend` implements :class:`~resurge.cluster.protocol.ClusterBackend`
whole; mypy checks that below. Nothing outside :mod:`resurge.cluster` names it: callers
get it from :func:`resurge.cluster.open_backend`; only the local cluster's own supervisor
(:mod:`resurge.local`) opens it to :meth:`~LocalBackend.forget_node` a node it took away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import nats.js.errors
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from resurge.cluster.local.keys import (
    CORDONS_BUCKET,
    JOB_STATUS_BUCKET,
    NODES_BUCKET,
    WORKER_GROUPS_BUCKET,
    node_key,
    worker_group_key,
)
from resurge.cluster.local.watch import watch_changes
from resurge.cluster.protocol import (
    NODE_TIMEOUT_SECONDS,
    ClusterBackend,
    ClusterChange,
    NodeInfo,
    UnknownNodeError,
    WorkerGroupSpec,
)
from resurge.contract.subjects import escape_token
from resurge.runtime.bus import Bus
from resurge.runtime.kv_keys import bucket_keys
from resurge.runtime.together import together

if TYPE_CHECKING:
    from resurge.jobspec import TrainingJob

log = logging.getLogger("resurge.cluster.local")

__all__ = ["NODE_TIMEOUT_SECONDS", "Cordon", "LocalBackend", "worker_group_key"]


class Cordon(BaseModel):
    """The control plane's cordon of one node (kept apart from the node's own record)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    reason: str = Field(default="", description="Why, in words (the unhealthy taint's value).")
    time: datetime = Field(default_factory=lambda: datetime.now(UTC))


async def _bucket(bus: Bus, name: str) -> KeyValue:
    """Bind bucket ``name``, creating it only where it is missing (a node agent's or a
    viewer's NATS user may read a bucket but not create one)."""
    try:
        return await bus.key_value(name)
    except nats.js.errors.BucketNotFoundError:
        return await bus.create_bucket(name, history=1)


async def _get(kv: KeyValue, key: str) -> bytes | None:
    try:
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError:
        return None
    return entry.value or None


async def _values(kv: KeyValue) -> list[bytes]:
    values = []
    for key in await bucket_keys(kv):
        value = await _get(kv, key)
        if value is not None:
            values.append(value)
    return values


def _group(value: bytes) -> WorkerGroupSpec | None:
    """The worker group a record holds; None, logged, for one that is not valid."""
    try:
        return WorkerGroupSpec.model_validate_json(value)
    except ValidationError as error:
        log.warning("skipping a worker group record that is not valid: %s", error)
        return None


def _with_cordon(node: NodeInfo, cordon: Cordon | None) -> NodeInfo:
    """A cordoned node is unschedulable and unhealthy, with the cordon's reason."""
    if cordon is not None:
        node.cordoned = True
        node.healthy = False
        node.cordon_reason = cordon.reason
    return node


class LocalBackend:
    """The local cluster's :class:`~resurge.cluster.protocol.ClusterBackend` (KV records)."""

    name: str = "local"
    launches_worker_groups: bool = True

    def __init__(
        self, nodes: KeyValue, groups: KeyValue, cordons: KeyValue, statuses: KeyValue
    ) -> None:
        self.nodes = nodes
        self.groups = groups
        self.cordons = cordons
        self.statuses = statuses

    @classmethod
    async def open(cls, bus: Bus) -> LocalBackend:
        """Create (or bind) the backend's buckets on ``bus``'s server; idempotent."""
        return cls(
            await _bucket(bus, NODES_BUCKET),
            await _bucket(bus, WORKER_GROUPS_BUCKET),
            await _bucket(bus, CORDONS_BUCKET),
            await _bucket(bus, JOB_STATUS_BUCKET),
        )

    def worker_domain(self, job: TrainingJob) -> None:
        """None: a local worker group is reached at its node's address."""
        return None

    def unfit_nodes(self, job: TrainingJob, nodes: Iterable[NodeInfo]) -> dict[str, str]:
        """No node: a job's pod template (its only placement constraints) is
        Kubernetes-only; every node may take its worker groups."""
        return {}

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node as its monitor last wrote it, with the control plane's cordons
        applied: a cordoned node is unschedulable and unhealthy."""
        cordons = {c.node: c for c in map(Cordon.model_validate_json, await _values(self.cordons))}
        nodes = [NodeInfo.model_validate_json(v) for v in await _values(self.nodes)]
        return [_with_cordon(node, cordons.get(node.name)) for node in nodes]

    async def live_nodes(self) -> list[NodeInfo]:
        """The nodes whose monitor wrote within ``NODE_TIMEOUT_SECONDS``."""
        now = datetime.now(UTC)
        return [n for n in await self.list_nodes() if n.alive(now, NODE_TIMEOUT_SECONDS)]

    async def report_node(self, info: NodeInfo) -> None:
        """Write the node's own record; its cordon lives apart and is kept."""
        record = info.model_copy(update={"cordoned": False, "cordon_reason": ""})
        await self.nodes.put(node_key(info.name), record.model_dump_json().encode())

    async def _read_node(self, name: str) -> NodeInfo | None:
        value = await _get(self.nodes, node_key(name))
        if value is None:
            return None
        cordon = await _get(self.cordons, node_key(name))
        return _with_cordon(
            NodeInfo.model_validate_json(value),
            None if cordon is None else Cordon.model_validate_json(cordon),
        )

    async def _known(self, node: str) -> None:
        """Raise :class:`UnknownNodeError` unless ``node`` has a record."""
        if await _get(self.nodes, node_key(node)) is not None:
            return
        known = ", ".join(sorted(n.name for n in await self.list_nodes())) or "none"
        raise UnknownNodeError(f"no node named {node!r} (nodes: {known})")

    async def list_worker_groups(self, job: str | None = None) -> list[WorkerGroupSpec]:
        """Every worker group, or only ``job``'s."""
        groups = [spec for v in await _values(self.groups) if (spec := _group(v)) is not None]
        return [g for g in groups if job is None or g.job == job]

    async def create_worker_group(self, spec: WorkerGroupSpec) -> None:
        """Write the group's record; the node's monitor (re)starts it."""
        key = worker_group_key(spec.node, spec.job, spec.replica)
        await self.groups.put(key, spec.model_dump_json().encode())

    async def delete_worker_group(self, job: str, replica: int, node: str) -> None:
        """Delete the group's record; the node's monitor stops it. Absent is fine."""
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.groups.delete(worker_group_key(node, job, replica))

    async def cordon(self, node: str, reason: str = "") -> None:
        """Idempotent: cordoning a cordoned node keeps its first reason."""
        await self._known(node)
        with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
            await self.cordons.create(
                node_key(node), Cordon(node=node, reason=reason).model_dump_json().encode()
            )

    async def uncordon(self, node: str) -> None:
        """Remove the node's cordon; an uncordoned node stays as it is."""
        await self._known(node)
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.cordons.delete(node_key(node))

    async def forget_node(self, node: str) -> None:
        """Purge ``node``'s record and cordon, once its monitor has stopped for good, so
        no one lists it (or counts it lost) again. Not part of the protocol: the local
        cluster's supervisor calls it when a node is removed. Absent is fine."""
        for bucket in (self.nodes, self.cordons):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await bucket.purge(node_key(node))

    async def write_job_status(self, job: str, status: dict[str, object]) -> None:
        """Replace ``job``'s status record (JSON)."""
        await self.statuses.put(escape_token(job), json.dumps(status).encode())

    async def read_job_status(self, job: str) -> dict[str, object] | None:
        """``job``'s status record; None if none was written."""
        value = await _get(self.statuses, escape_token(job))
        if value is None:
            return None
        status: dict[str, object] = json.loads(value)
        return status

    def watch(self, node: str | None = None) -> AsyncIterator[ClusterChange]:
        """Nodes and worker groups now, then each change (:mod:`.watch`)."""
        return watch_changes(self.nodes, self.cordons, self.groups, self._read_node, node)

    async def reconcile(self, *also: Callable[[], Awaitable[None]]) -> None:
        """Nothing to do until cancelled but run ``also``: each node's monitor turns its
        worker groups into processes."""
        await together(*also, asyncio.Event().wait)


# mypy fails here when LocalBackend drifts from the protocol.
_CONFORMS: type[ClusterBackend] = LocalBackend
