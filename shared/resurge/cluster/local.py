"""The local backend: nodes and worker groups as JetStream KV records.

Bucket ``<ns>_nodes`` holds one :class:`NodeInfo` per virtual node (written by its
monitor agent); bucket ``<ns>_cordons`` one :class:`Cordon` per cordoned node (written
by the control plane, so a monitor's heartbeat never undoes it, as a kubelet never
undoes ``spec.unschedulable``); bucket ``<ns>_workergroups`` holds one :class:`WorkerGroupSpec` per
(node, job, replica) under the key ``<node>.<job>.<replica>`` (escaped tokens), which
the node's monitor agent watches and turns into ``resurge-node-agent launch``
processes.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

import nats.js.errors
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field

from resurge.cluster.protocol import NodeInfo, WorkerGroupSpec
from resurge.contract.subjects import escape_token
from resurge.runtime.bus import Bus
from resurge.runtime.kv_keys import bucket_keys

__all__ = ["NODE_TIMEOUT_SECONDS", "Cordon", "LocalBackend", "worker_group_key"]

# A node whose monitor has not written for this long gets no new work.
NODE_TIMEOUT_SECONDS = 15.0


class Cordon(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    reason: str = Field(default="", description="Why, in words (the unhealthy taint's value).")
    time: datetime = Field(default_factory=lambda: datetime.now(UTC))


def worker_group_key(node: str, job: str, replica: int) -> str:
    return f"{escape_token(node)}.{escape_token(job)}.{replica}"


async def _bucket(bus: Bus, name: str) -> KeyValue:
    return await bus.js.create_key_value(
        KeyValueConfig(bucket=bus.subjects.kv_bucket(name), history=1)
    )


async def _values(kv: KeyValue) -> list[bytes]:
    values = []
    for key in await bucket_keys(kv):
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            continue
        if entry.value:
            values.append(entry.value)
    return values


class LocalBackend:
    def __init__(self, nodes: KeyValue, groups: KeyValue, cordons: KeyValue) -> None:
        self.nodes = nodes
        self.groups = groups
        self.cordons = cordons

    @classmethod
    async def open(cls, bus: Bus) -> LocalBackend:
        return cls(
            await _bucket(bus, "nodes"),
            await _bucket(bus, "workergroups"),
            await _bucket(bus, "cordons"),
        )

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node as its monitor last wrote it, with the control plane's cordons applied:
        a cordoned node is unschedulable and unhealthy."""
        cordons = {c.node: c for c in map(Cordon.model_validate_json, await _values(self.cordons))}
        nodes = [NodeInfo.model_validate_json(v) for v in await _values(self.nodes)]
        for node in nodes:
            if node.name in cordons:
                node.cordoned = True
                node.healthy = False
                node.cordon_reason = cordons[node.name].reason
        return nodes

    async def live_nodes(self) -> list[NodeInfo]:
        now = datetime.now(UTC)
        return [n for n in await self.list_nodes() if n.alive(now, NODE_TIMEOUT_SECONDS)]

    async def put_node(self, node: NodeInfo) -> None:
        await self.nodes.put(escape_token(node.name), node.model_dump_json().encode())

    async def list_worker_groups(self) -> list[WorkerGroupSpec]:
        return [WorkerGroupSpec.model_validate_json(v) for v in await _values(self.groups)]

    async def create_worker_group(self, spec: WorkerGroupSpec) -> None:
        key = worker_group_key(spec.node, spec.job, spec.replica)
        await self.groups.put(key, spec.model_dump_json().encode())

    async def delete_worker_group(self, job: str, replica: int, node: str) -> None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.groups.delete(worker_group_key(node, job, replica))

    async def cordon(self, node: str, cordoned: bool = True, reason: str = "") -> None:
        """Idempotent: cordoning a cordoned node keeps its first reason."""
        key = escape_token(node)
        if not cordoned:
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                await self.cordons.delete(key)
            return
        with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
            await self.cordons.create(
                key, Cordon(node=node, reason=reason).model_dump_json().encode()
            )
