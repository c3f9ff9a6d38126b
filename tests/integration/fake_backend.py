"""An in-memory :class:`~resurge.cluster.ClusterBackend` that records every call.

It is a fake on purpose: the tests that use it are about the restarter's exactly-once
dispatch steps (what it asks of a cluster, how often, and in which order, across
crashes and restarts), not about a cluster. It keeps nodes, cordons, worker groups
and job statuses in dictionaries with the protocol's semantics (idempotent writes, a
second cordon keeps the first reason, an unknown node raises), and it can be told to
fail a given call, as an unreachable cluster would, to stop a dispatcher part-way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from resurge.cluster import (
    BackendError,
    ClusterChange,
    NodeInfo,
    UnknownNodeError,
    WorkerGroupSpec,
)
from resurge.jobspec import TrainingJob

__all__ = ["WRITES", "Call", "FakeBackend"]

WRITES = frozenset(
    {
        "report_node",
        "create_worker_group",
        "delete_worker_group",
        "cordon",
        "uncordon",
        "write_job_status",
    }
)
"""The methods that change the cluster (the others only read it)."""


@dataclass(frozen=True)
class Call:
    """One method call: its name, its arguments, and when it began."""

    method: str
    args: tuple[Any, ...]
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    failed: bool = False


class FakeBackend:
    """A cluster of ``nodes`` running ``groups``, in memory; ``calls`` lists every call
    in order (setting it up is no call)."""

    name = "fake"
    launches_worker_groups = True

    def __init__(self, nodes: list[NodeInfo], groups: Sequence[WorkerGroupSpec] = ()) -> None:
        self.nodes = {n.name: n.model_copy() for n in nodes}
        self.groups = {(g.node, g.job, g.replica): g for g in groups}
        self.statuses: dict[str, dict[str, object]] = {}
        # The nodes each job may not use, with why (what unfit_nodes answers).
        self.unfit: dict[str, dict[str, str]] = {}
        self.calls: list[Call] = []
        self._failures: dict[str, int] = {}
        self._down: set[str] = set()
        self._changed = asyncio.Condition()
        self._watchers: list[asyncio.Queue[ClusterChange]] = []

    def fail(self, method: str, occurrence: int = 1) -> None:
        """Make the ``occurrence``-th call of ``method`` from now on raise
        :class:`BackendError` without changing anything (once)."""
        self._failures[method] = occurrence

    def down(self, method: str) -> None:
        """Make every call of ``method`` raise :class:`BackendError` (changing nothing)
        until :meth:`up`: a cluster unreachable for a while."""
        self._down.add(method)

    def up(self, method: str) -> None:
        """Undo :meth:`down`."""
        self._down.discard(method)

    def writes(self) -> list[Call]:
        """The calls that changed (or, failing, would have changed) the cluster."""
        return [c for c in self.calls if c.method in WRITES]

    async def wait_for(self, test: Callable[[list[Call]], Any], seconds: float = 20) -> Any:
        """Wait until ``test(calls)`` is truthy; return that value."""
        found: list[Any] = []

        def check() -> bool:
            found[:] = [test(self.calls)]
            return bool(found[0])

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(check), seconds)
        return found[0]

    async def _record(self, method: str, *args: Any) -> None:
        left = self._failures.get(method)
        failing = left == 1
        if left is not None:
            if failing:
                del self._failures[method]
            else:
                self._failures[method] = left - 1
        failing = failing or method in self._down
        async with self._changed:
            self.calls.append(Call(method, args, failed=failing))
            self._changed.notify_all()
        if failing:
            raise BackendError(f"{method}: the fake cluster was told to fail this call")

    def _node(self, name: str) -> NodeInfo:
        if name not in self.nodes:
            raise UnknownNodeError(f"no node {name!r}; known: {', '.join(sorted(self.nodes))}")
        return self.nodes[name]

    def _tell(self, change: ClusterChange) -> None:
        for queue in self._watchers:
            queue.put_nowait(change)

    def _node_changed(self, info: NodeInfo) -> None:
        self._tell(ClusterChange(kind="node", node=info.name, node_info=info.model_copy()))

    def worker_domain(self, job: TrainingJob) -> None:
        """None: groups are reached at their node's address, as on a local cluster."""
        return None

    def unfit_nodes(self, job: TrainingJob, nodes: Iterable[NodeInfo]) -> dict[str, str]:
        """The nodes of ``nodes`` that :attr:`unfit` names for ``job``, with its words."""
        unfit = self.unfit.get(job.name, {})
        return {n.name: unfit[n.name] for n in nodes if n.name in unfit}

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node, cordons applied."""
        await self._record("list_nodes")
        return [n.model_copy() for n in self.nodes.values()]

    async def live_nodes(self) -> list[NodeInfo]:
        """Every node: in this fake every node's monitor is alive."""
        await self._record("live_nodes")
        return [n.model_copy() for n in self.nodes.values()]

    async def report_node(self, info: NodeInfo) -> None:
        """Write a node's record, keeping its cordon."""
        await self._record("report_node", info)
        old = self.nodes.get(info.name)
        kept = {} if old is None or not old.cordoned else _cordon_fields(old)
        self.nodes[info.name] = info.model_copy(update=kept)
        self._node_changed(self.nodes[info.name])

    async def list_worker_groups(self, job: str | None = None) -> list[WorkerGroupSpec]:
        """Every worker group, or ``job``'s."""
        await self._record("list_worker_groups", job)
        return [g for g in self.groups.values() if job is None or g.job == job]

    async def create_worker_group(self, spec: WorkerGroupSpec) -> None:
        """Create or replace the group of (job, replica) on its node."""
        await self._record("create_worker_group", spec)
        self.groups[(spec.node, spec.job, spec.replica)] = spec
        self._tell(
            ClusterChange(
                kind="worker_group",
                node=spec.node,
                job=spec.job,
                replica=spec.replica,
                worker_group=spec,
            )
        )

    async def delete_worker_group(self, job: str, replica: int, node: str) -> None:
        """Remove that group; an absent one is fine."""
        await self._record("delete_worker_group", job, replica, node)
        if self.groups.pop((node, job, replica), None) is not None:
            self._tell(
                ClusterChange(
                    kind="worker_group", deleted=True, node=node, job=job, replica=replica
                )
            )

    async def cordon(self, node: str, reason: str = "") -> None:
        """Cordon ``node``; a second cordon keeps the first reason."""
        await self._record("cordon", node, reason)
        info = self._node(node)
        if not info.cordoned:
            self.nodes[node] = info.model_copy(
                update={"cordoned": True, "healthy": False, "cordon_reason": reason}
            )
            self._node_changed(self.nodes[node])

    async def uncordon(self, node: str) -> None:
        """Undo :meth:`cordon`."""
        await self._record("uncordon", node)
        info = self._node(node)
        if info.cordoned:
            self.nodes[node] = info.model_copy(
                update={"cordoned": False, "healthy": True, "cordon_reason": ""}
            )
            self._node_changed(self.nodes[node])

    async def write_job_status(self, job: str, status: dict[str, object]) -> None:
        """Replace ``job``'s status."""
        await self._record("write_job_status", job, status)
        self.statuses[job] = dict(status)

    async def read_job_status(self, job: str) -> dict[str, object] | None:
        """The status last written for ``job``."""
        await self._record("read_job_status", job)
        return self.statuses.get(job)

    async def reconcile(self, *also: Callable[[], Awaitable[None]]) -> None:
        """Nothing to keep in line (the records are the cluster) but run ``also``."""
        await asyncio.gather(*(part() for part in also))

    async def watch(self, node: str | None = None) -> AsyncIterator[ClusterChange]:
        """Every node and group now, then each change (of ``node`` only, if given)."""
        queue: asyncio.Queue[ClusterChange] = asyncio.Queue()
        for info in self.nodes.values():
            queue.put_nowait(ClusterChange(kind="node", node=info.name, node_info=info))
        for spec in self.groups.values():
            queue.put_nowait(
                ClusterChange(
                    kind="worker_group",
                    node=spec.node,
                    job=spec.job,
                    replica=spec.replica,
                    worker_group=spec,
                )
            )
        self._watchers.append(queue)
        try:
            while True:
                change = await queue.get()
                if node is None or change.node == node:
                    yield change
        finally:
            self._watchers.remove(queue)


def _cordon_fields(node: NodeInfo) -> dict[str, Any]:
    return {"cordoned": True, "healthy": False, "cordon_reason": node.cordon_reason}
