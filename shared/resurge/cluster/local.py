"""The local backend: nodes and worker groups as JetStream KV records.

Bucket ``<ns>_nodes`` holds one :class:`NodeInfo` per virtual node (written by its
monitor agent); bucket ``<ns>_workergroups`` holds one :class:`WorkerGroupSpec` per
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

from resurge.bus import Bus
from resurge.cluster.protocol import NodeInfo, WorkerGroupSpec
from resurge.subjects import escape_token

__all__ = ["NODE_TIMEOUT_SECONDS", "LocalBackend", "worker_group_key"]

# A node whose monitor has not written for this long gets no new work.
NODE_TIMEOUT_SECONDS = 15.0


def worker_group_key(node: str, job: str, replica: int) -> str:
    return f"{escape_token(node)}.{escape_token(job)}.{replica}"


async def _bucket(bus: Bus, name: str) -> KeyValue:
    return await bus.js.create_key_value(
        KeyValueConfig(bucket=bus.subjects.kv_bucket(name), history=1)
    )


async def _values(kv: KeyValue) -> list[bytes]:
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    values = []
    for key in keys:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            continue
        if entry.value:
            values.append(entry.value)
    return values


class LocalBackend:
    def __init__(self, nodes: KeyValue, groups: KeyValue) -> None:
        self.nodes = nodes
        self.groups = groups

    @classmethod
    async def open(cls, bus: Bus) -> LocalBackend:
        return cls(await _bucket(bus, "nodes"), await _bucket(bus, "workergroups"))

    async def list_nodes(self) -> list[NodeInfo]:
        return [NodeInfo.model_validate_json(v) for v in await _values(self.nodes)]

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

    async def cordon(self, node: str, cordoned: bool = True) -> None:
        try:
            entry = await self.nodes.get(escape_token(node))
        except nats.js.errors.KeyNotFoundError:
            raise KeyError(f"no node named {node!r}") from None
        assert entry.value is not None
        info = NodeInfo.model_validate_json(entry.value)
        info.cordoned = cordoned
        await self.put_node(info)
