"""The scaler's resizes: decide (:mod:`resurge.control.decisions.elastic_decision`), checkpoint,
write the plan.

:meth:`Resizer.rebalance` reads every job record and the live nodes, builds the
decision's input (:mod:`.shapes`) and carries out what it returns: grow, shrink and
suspend. Admissions are the scaler's admission pass
(:mod:`resurge.control.decisions.admission`); a waiting job that needs room makes the
decision shrink or suspend lower-priority jobs, and the admission pass places it once
their slots are free.

Each resize runs in its own task, and the job counts as busy until it is written:

1. replicas it adds get their worker groups now, and the resize waits (at most
   ``elastic.scalingTimeoutSeconds``) until each one's agent is up and waiting, fork
   server warm; the job trains on meanwhile (not in time: the groups are deleted and
   the resize dropped, to be decided again);
2. when the workers report progress (they use ``resurge.worker``) and none of the
   replicas that go is on a lost node, CheckpointNow to every replica, then wait at most
   ``elastic.checkpointTimeoutSeconds`` for a newer checkpoint every rank saved (the
   restarter counts the reports into the record); a record that moved to another
   generation meanwhile (a fault) drops the resize;
3. the resize written into the record with one compare-and-set
   (:func:`.resize_plan.apply_resize`), which fails if a restart won meanwhile; the
   restarter, watching the records, carries the plan out as it does a recovery's;
4. ScaleDecided on ``action.<job>`` (job, from, to, why).

A resize that does not happen (a fault won, or the warm-up timed out) deletes the
worker groups it created.

Nodes being removed (``resurge node remove``) count as lost long ago, so the jobs on
them shrink at once rather than after ``faultyScaleDownTimeoutSeconds``. Nodes that
became schedulable since the scaler's first look count from when it first saw them so,
and a grow waits a few seconds past the newest (the decision's ``settle``), so nodes
added together are grown into in one resize.

A grow the decision holds back (cool-down, snooze, capacity still arriving) is written
into the job's record (``held_grow``: to what size, why, until when), and cleared when
it no longer waits, so ``resurge status`` says why a job does not grow yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial

from resurge.cluster import ClusterBackend, NodeInfo
from resurge.contract.subscriptions import SCALER_RESIZE_AGENTS, Scope
from resurge.control.decisions.elastic_decision import GrowWait, Kind, Resize, plan
from resurge.control.decisions.restore_reports import live_state_serves_a_resize
from resurge.control.decisions.worker_groups import worker_group
from resurge.control.effects.checkpoint_first import checkpoint_first
from resurge.control.effects.nodes import is_being_removed
from resurge.control.state.allocations import (
    AllocationConflict,
    Allocations,
    Claim,
    open_allocations,
)
from resurge.control.state.records import HeldGrow, JobRecord, JobStore, Placement
from resurge.control.views.cluster_snapshot import ClusterReads, read_snapshot
from resurge.events import AgentState, AgentStateChanged, Event, ScaleDecided
from resurge.runtime.service import ServiceContext
from resurge_scaler.metrics import ScalerMetrics
from resurge_scaler.resize_plan import apply_resize, removed_nodes
from resurge_scaler.shapes import lost_since, ready_since, shapes_from

__all__ = ["Resizer"]

_CARRIED_OUT = (Kind.GROW, Kind.SHRINK, Kind.SUSPEND)
_LONG_AGO = 1e9  # seconds before now: a node being removed is overdue at once
_ATTEMPTS = 20
_CLAIM_MARGIN = 30.0  # seconds a grow's claims outlive its warm-up and checkpoint bounds


class Resizer:
    """Decides and writes resizes for one scaler over its store and backend."""

    def __init__(
        self,
        ctx: ServiceContext,
        store: JobStore,
        backend: ClusterBackend,
        metrics: ScalerMetrics | None = None,
        allocations: Callable[[], Awaitable[Allocations]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.metrics = metrics
        self.bus = ctx.bus
        self.store = store
        self.backend = backend
        self.reads = ClusterReads(
            backend.list_nodes,
            backend.live_nodes,
            backend.list_worker_groups,
            backend.unfit_nodes,
        )
        self.lost: dict[str, float] = {}
        self.ready: dict[str, float | None] | None = None
        self.in_flight: set[str] = set()
        self._deciding = asyncio.Lock()
        self._open_allocations = allocations
        self._allocations: Allocations | None = None

    async def allocations(self) -> Allocations:
        """The allocation ledger (the scaler's, or one made on first use)."""
        if self._allocations is None:
            if self._open_allocations is not None:
                self._allocations = await self._open_allocations()
            else:
                self._allocations = await open_allocations(self.bus, self.bus.source.instance)
            assert self._allocations is not None
        return self._allocations

    async def rebalance(self) -> None:
        """Decide once on the cluster snapshot as it is now; claim the slots each grow
        adds (a lost claim decides again), then start each resize."""
        async with self._deciding:
            allocations = await self.allocations()
            for _ in range(_ATTEMPTS):
                if await self._decide(allocations):
                    return
            self.ctx.log.warning("resizes skipped: the allocation ledger kept moving")

    async def _decide(self, allocations: Allocations) -> bool:
        """One decision and its claims; False if another placer wrote meanwhile."""
        snapshot = await read_snapshot(self.reads, self.store, allocations)
        records = [r for r in snapshot.records if not r.phase.finished]
        if not records:
            self.lost = {}
            return True
        nodes = snapshot.nodes
        now = time.time()
        self.lost = lost_since(self.lost, records, nodes, now)
        self.ready = ready_since(self.ready, nodes, now)
        for node in nodes:
            if is_being_removed(node) and node.name in self.lost:
                self.lost[node.name] = now - _LONG_AGO
        resized = {
            r.name: r.last_resize.time.timestamp() for r in records if r.last_resize is not None
        }
        cluster, shapes = shapes_from(
            records,
            nodes,
            now,
            resized_at=resized,
            lost=self.lost,
            ready=self.ready,
            reserved=snapshot.reserved(),
            unfit=snapshot.unfit,
        )
        # A resize in flight here or at another scaler (its slots claimed) is busy.
        busy = self.in_flight | snapshot.claimed_jobs()
        shapes = [replace(s, busy=True) if s.name in busy else s for s in shapes]
        decided = plan(cluster, shapes, now)
        by_name = {r.name: r for r in records}
        for record in records:
            held = _held(decided.held.get(record.name))
            if record.held_grow != held:
                await self.store.mutate(record.name, partial(_note_held, held=held))
        addresses = {n.name: n.address for n in nodes}
        carried = [r for r in decided.resizes if r.kind in _CARRIED_OUT]
        claims = {r.job: _claims(allocations, by_name[r.job], r, addresses) for r in carried}
        new = [claim for held in claims.values() for claim in held]
        if new:
            try:
                await allocations.claim(snapshot.claims, snapshot.revision, new)
            except AllocationConflict:
                return False
        for resize in carried:
            self.in_flight.add(resize.job)
            self.ctx.spawn(self._carry_out(by_name[resize.job], resize, nodes, claims[resize.job]))
        return True

    async def _carry_out(
        self, record: JobRecord, resize: Resize, nodes: list[NodeInfo], claims: list[Claim]
    ) -> None:
        try:
            await self._resize(record, resize, nodes)
        except Exception:
            self.ctx.log.exception("resizing %s failed", record.name, extra={"job": record.name})
        finally:
            try:
                await (await self.allocations()).release(claims)
            finally:
                self.in_flight.discard(record.name)

    async def _resize(self, record: JobRecord, resize: Resize, nodes: list[NodeInfo]) -> None:
        addresses = {n.name: n.address for n in nodes}
        write = partial(
            apply_resize, resize=resize, generation=record.generation, addresses=addresses
        )
        preview = record.model_copy(deep=True)
        if not write(preview, now=datetime.now(UTC)):
            return
        added = _added(preview)
        if added and not await self._warm_up(preview, added):
            await self._remove(record.name, added)
            return
        fine = {n.name for n in nodes if n.schedulable or is_being_removed(n)}
        reachable = all(node in fine for node in removed_nodes(record, resize))
        # A job whose ranks keep replicated state live hands it to new ranks from memory.
        checkpoint_first = (
            record.reports_progress and reachable and not live_state_serves_a_resize(record)
        )
        if checkpoint_first and not await self._checkpoint_first(record, resize):
            await self._remove(record.name, added)
            return
        result = await self.store.mutate(record.name, partial(write, now=datetime.now(UTC)))
        if result is None or result[0] is result[1]:
            self.ctx.log.info(
                "resize of %s dropped: its record changed meanwhile",
                record.name,
                extra={"job": record.name},
            )
            await self._remove(record.name, added)
            return
        before, after = result
        self.ctx.log.info(
            "resizing %s to generation %d: %s",
            after.name,
            after.generation,
            resize.why,
            extra={"job": after.name, "generation": after.generation},
        )
        decided = ScaleDecided(
            source=self.bus.source,
            job=after.name,
            generation=after.generation,
            resize=resize.kind.value,
            from_replicas=resize.from_replicas,
            to_replicas=resize.to_replicas,
            why=resize.why,
            from_generation=before.generation,
            to_generation=after.generation,
        )
        await self.bus.publish(self.bus.subjects.action(after.name), decided)
        if self.metrics is not None:
            self.metrics.resized(resize.kind.value)

    async def _warm_up(self, preview: JobRecord, added: list[Placement]) -> bool:
        """Create the added replicas' worker groups and wait (at most
        ``elastic.scalingTimeoutSeconds``) until each agent is waiting for its first
        assignment, its fork server warm: the job trains on meanwhile, so the switch to
        the new size does not wait for them. False if they do not come up in time."""
        bound = preview.spec.spec.elastic.scaling_timeout_seconds
        waiting: set[int] = set()
        wanted = {p.replica for p in added}
        came = asyncio.Event()

        async def on_state(event: Event, subject: str) -> None:
            if (
                isinstance(event, AgentStateChanged)
                and event.state is AgentState.WAITING
                and event.replica in wanted
            ):
                waiting.add(event.replica)
                if waiting == wanted:
                    came.set()

        [subscription] = await self.bus.bind(
            SCALER_RESIZE_AGENTS, on_state, Scope(job=preview.name)
        )
        try:
            for placement in added:
                await self.backend.create_worker_group(worker_group(preview, placement))
            await asyncio.wait_for(came.wait(), bound)
        except TimeoutError:
            missing = ", ".join(str(r) for r in sorted(wanted - waiting))
            self.ctx.log.warning(
                "resize of %s dropped: replica(s) %s did not come up within %g s",
                preview.name,
                missing,
                bound,
                extra={"job": preview.name},
            )
            return False
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        return True

    async def _remove(self, job: str, added: list[Placement]) -> None:
        """Delete the worker groups warmed up for a resize that did not happen, except
        those the record places now (another scaler replica's same resize won)."""
        found = await self.store.get(job)
        placed = {(p.replica, p.node) for p in found[0].placements} if found else set()
        for placement in added:
            if (placement.replica, placement.node) not in placed:
                await self.backend.delete_worker_group(job, placement.replica, placement.node)

    async def _checkpoint_first(self, record: JobRecord, resize: Resize) -> bool:
        """Ask for a checkpoint and wait (bounded) for every rank to have saved a newer
        one; False if the job moved to another generation meanwhile."""
        bound = record.spec.spec.elastic.checkpoint_timeout_seconds
        reason = f"{resize.kind.value} {resize.from_replicas} -> {resize.to_replicas}"
        return await checkpoint_first(self.bus, self.store, record, reason, bound, self.ctx.log)


def _held(wait: GrowWait | None) -> HeldGrow | None:
    if wait is None:
        return None
    until = datetime.fromtimestamp(wait.until, UTC)
    return HeldGrow(to_replicas=wait.to_replicas, why=wait.why, until=until)


def _note_held(record: JobRecord, held: HeldGrow | None) -> bool:
    """Write the grow held back for ``record`` (None: none waits)."""
    if record.held_grow == held or record.phase.finished:
        return False
    record.held_grow = held
    return True


def _claims(
    allocations: Allocations, record: JobRecord, resize: Resize, addresses: dict[str, str]
) -> list[Claim]:
    """Claims of the slots ``resize`` adds to ``record`` (its replicas' indices as
    :func:`.resize_plan.apply_resize` gives them), held while they warm up and the
    checkpoint is taken, plus a margin."""
    if not resize.add:
        return []
    preview = record.model_copy(deep=True)
    now = datetime.now(UTC)
    write = apply_resize(
        preview, resize, generation=record.generation, addresses=addresses, now=now
    )
    if not write:
        return []
    elastic = record.spec.spec.elastic
    ttl = elastic.scaling_timeout_seconds + elastic.checkpoint_timeout_seconds + _CLAIM_MARGIN
    nproc = record.spec.spec.nproc_per_node
    return [allocations.make(record.name, p.replica, p.node, nproc, ttl) for p in _added(preview)]


def _added(preview: JobRecord) -> list[Placement]:
    """The placements a resize written into ``preview`` adds."""
    plan = preview.pending_recovery
    if plan is None:
        return []
    return [p for p in preview.placements if p.replica in plan.recreate]
