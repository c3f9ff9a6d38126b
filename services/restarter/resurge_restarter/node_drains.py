"""Drains that ask first: an operator's ``resurge node drain`` carried out.

The CLI writes a :class:`~resurge.control.state.node_health.Drain` into the node's health
record; the restarter's watch of those records (:mod:`.node_ledger`) hands each drain not
yet done to :meth:`Drainer.drain`, which:

1. cordons the node (its reason: drained, and by whom);
2. notes the jobs on it in the drain, and moves each off at its next checkpoint
   (:mod:`.node_moves`, reason ``node_drained``), all at once;
3. writes what it did for each job, and when the last is off, the drain's end.

A restarter that dies mid-drain leaves it not done: whichever restarter watches next
takes it up again (a job already off the node is said so; a move decided twice is one
recovery: the fault id is the drain's). Each instance drains a node once at a time.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from resurge.cluster import ClusterBackend
from resurge.control.state.node_health import Drain, NodeHealth, NodeHealthStore
from resurge.control.state.records import JobStore
from resurge.runtime.service import ServiceContext
from resurge_restarter.node_moves import MoveOff, NodeMover, runs_on

__all__ = ["DRAIN_REASON", "Drainer"]

DRAIN_REASON = "node_drained"


class Drainer:
    """Carries out the drains operators ask for."""

    def __init__(
        self,
        ctx: ServiceContext,
        backend: ClusterBackend,
        nodes: NodeHealthStore,
        jobs: JobStore,
        mover: NodeMover,
    ) -> None:
        self.ctx = ctx
        self.backend = backend
        self.nodes = nodes
        self.jobs = jobs
        self.mover = mover
        self._draining: set[str] = set()

    def seen(self, record: NodeHealth) -> None:
        """A node's record as written: start its drain if one is asked and not done."""
        drain = record.drain
        if drain is None or drain.done is not None or record.name in self._draining:
            return
        self._draining.add(record.name)
        self.ctx.spawn(self.drain(record.name, drain), name=f"drain-{record.name}")

    async def drain(self, node: str, drain: Drain) -> None:
        """Cordon ``node``, move every job off it at its next checkpoint, say what was done."""
        try:
            await self.backend.cordon(node, f"drained by {drain.by}: {drain.reason}".rstrip(": "))
            on_it = [r for r in await self.jobs.all() if runs_on(r, node)]
            names = [r.name for r in on_it]
            now = datetime.now(UTC)
            await self.nodes.mutate(node, lambda r: _begin(r, drain, names, now))
            self.ctx.log.warning(
                "draining node %s (%s): moving %s off it at their next checkpoint",
                node, drain.by, ", ".join(names) or "no job",
            )  # fmt: skip
            off = MoveOff(
                node, DRAIN_REASON, f"node {node} is drained", drain.requested.isoformat()
            )

            async def one(job: str) -> None:
                found = await self.jobs.get(job)
                said = "gone" if found is None else await self.mover.move_off(found[0], off)
                await self.nodes.mutate(node, lambda r: _said(r, drain, job, said))
                self.ctx.log.info("drain of %s: job %s: %s", node, job, said)

            await asyncio.gather(*(one(name) for name in names))
            await self.nodes.mutate(node, lambda r: _end(r, drain, datetime.now(UTC)))
        finally:
            self._draining.discard(node)


def _ours(record: NodeHealth, drain: Drain) -> bool:
    return record.drain is not None and record.drain.requested == drain.requested


def _begin(record: NodeHealth, drain: Drain, jobs: list[str], now: datetime) -> bool:
    if not _ours(record, drain) or record.drain is None or record.drain.started is not None:
        return False
    record.drain = record.drain.model_copy(
        update={"started": now, "jobs": {**{j: "" for j in jobs}, **record.drain.jobs}}
    )
    return True


def _said(record: NodeHealth, drain: Drain, job: str, said: str) -> bool:
    if not _ours(record, drain) or record.drain is None:
        return False
    record.drain = record.drain.model_copy(update={"jobs": {**record.drain.jobs, job: said}})
    return True


def _end(record: NodeHealth, drain: Drain, now: datetime) -> bool:
    if not _ours(record, drain) or record.drain is None or record.drain.done is not None:
        return False
    record.drain = record.drain.model_copy(update={"done": now})
    return True
