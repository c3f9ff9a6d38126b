"""Drains that others start: a node about to have its pods evicted is drained first.

The restarter watches the cluster's nodes (``ClusterBackend.watch``). A node that shows
an eviction sign (:func:`resurge.control.decisions.eviction_signs.eviction_sign`: a
``NoExecute`` taint, Karpenter's disruption taint, a cordon by another controller)
while a job runs on it gets a drain asked in its health record, by ``kubernetes`` with
the sign as the reason, as ``resurge node drain`` asks one: the restarter's drainer
(:mod:`.node_drains`) then checkpoints each job on it and moves it off, and says so in
the record (``resurge node describe``). One drain per sign: it is asked again only after
the sign went away and came back.

On Kubernetes the checkpoint comes before the pods go
(:mod:`resurge.cluster.kubernetes.disruption`): each job's PodDisruptionBudget refuses
the evictions of ``kubectl drain``, Karpenter and cluster upgrades until the drain has
moved the job by deleting its pods, and its pods tolerate a ``NoExecute`` taint for
the job's checkpoint deadline and a margin.
"""

from __future__ import annotations

from datetime import UTC, datetime

from resurge.cluster import ClusterBackend, watching
from resurge.control.decisions.eviction_signs import eviction_sign
from resurge.control.state.node_health import NodeHealthStore, ask_drain
from resurge.control.state.records import JobStore
from resurge.runtime.service import ServiceContext
from resurge_restarter.node_moves import runs_on

__all__ = ["EvictionWatch"]


class EvictionWatch:
    """Asks for a drain of each node that shows an eviction sign under a job."""

    def __init__(
        self, ctx: ServiceContext, backend: ClusterBackend, nodes: NodeHealthStore, jobs: JobStore
    ) -> None:
        self.ctx = ctx
        self.backend = backend
        self.nodes = nodes
        self.jobs = jobs
        self._asked: dict[str, str] = {}  # node -> the sign a drain was asked for

    def start(self) -> None:
        """Watch in the background (the watch starts again if it fails)."""
        self.ctx.spawn(self.run, name="eviction_watch")

    async def run(self) -> None:
        """Read the cluster's node changes and ask for the drains they call for."""
        async with watching(self.backend) as changes:
            async for change in changes:
                if change.kind == "node" and change.node_info is not None:
                    sign = None if change.deleted else eviction_sign(change.node_info)
                    await self.seen(change.node, sign)

    async def seen(self, node: str, sign: str | None) -> None:
        """Node ``node`` shows ``sign`` (None: none): ask for its drain once per sign."""
        if sign is None:
            self._asked.pop(node, None)
            return
        if self._asked.get(node) == sign:
            return
        if not any(runs_on(record, node) for record in await self.jobs.all()):
            return
        self._asked[node] = sign
        now = datetime.now(UTC)
        await self.nodes.mutate(node, lambda r: ask_drain(r, now, "kubernetes", sign))
        self.ctx.log.warning(
            "node %s: %s; draining it first (jobs checkpointed, then moved)", node, sign
        )
