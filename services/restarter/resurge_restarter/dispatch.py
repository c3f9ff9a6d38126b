"""Carrying out a recovery plan (``JobRecord.pending_recovery``), idempotently.

:meth:`Dispatcher.carry_out` runs the plan's steps in order, each safe to repeat:

1. RecoveryStarted and PhaseChanged on ``action.<job>`` (ids derived from the job and
   generation, so a repeat is de-duplicated by JetStream);
2. Stop(g) to where the failed generation ran (not for ``in_process``: those workers
   stay and re-enter their training function); for a resize, to ``stop_placements``
   only (the replicas that go, or every replica where the workers cannot re-enter
   in-process), and no RecoveryStarted (the scaler announced it with ScaleDecided);
3. cordons; moved replicas' worker groups deleted on the old node and created on the
   new one; recreated (for a resize: added) replicas' worker groups written; for a
   requeue or a resize, the worker groups of the old placements that are not placements
   any more deleted;
4. the backoff wait (in a background task, so the fault consumer is never held);
5. Assign(g+1) to every replica (ids derived from job, replica and generation);
6. the plan marked dispatched (compare-and-set).

A restarter that dies anywhere in there leaves the plan undispatched; the next
restarter to look carries it out again from step 1 once the claim has lapsed. The
cluster is reached only through :class:`~resurge.cluster.ClusterBackend`, whose
writes are idempotent too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from resurge.cluster import ClusterBackend
from resurge.contract.subjects import unescape_token
from resurge.control.job_messages import (
    assignment_messages,
    phase_message,
    publish_all,
    stop_messages,
)
from resurge.control.planner import command_id
from resurge.control.records import JobRecord, JobStore
from resurge.control.recovery_policy import ClusterView, mark_dispatched
from resurge.control.worker_groups import worker_group
from resurge.events import Envelope, JobPhase, RecoveryLevel, RecoveryStarted
from resurge.runtime.service import ServiceContext

__all__ = ["Dispatcher", "cluster_view"]

Check = Callable[[str], Awaitable[None]]
"""Called with a job's name: look at its record again."""


async def cluster_view(backend: ClusterBackend, exclude_job: str | None = None) -> ClusterView:
    """Live nodes and the slots worker groups take on each (``exclude_job``'s not counted)."""
    used: dict[str, int] = {}
    for group in await backend.list_worker_groups():
        if group.job != exclude_job:
            used[group.node] = used.get(group.node, 0) + group.nproc
    return ClusterView(nodes=await backend.live_nodes(), used=used)


def _changes_cluster(record: JobRecord) -> bool:
    """Whether step 3 has anything to do for ``record``'s plan."""
    plan = record.pending_recovery
    assert plan is not None
    if plan.cordon or plan.moves or plan.requeue or plan.resize:
        return True
    placed = {p.replica for p in record.placements}
    return any(replica in placed for replica in plan.recreate)


class Dispatcher:
    """Carries plans out for one restarter instance (``me``), and schedules re-checks.

    ``retry`` is called with a job's name when carrying out its plan failed after the
    backoff wait (the fault that led to it was acknowledged long before).
    """

    def __init__(
        self,
        ctx: ServiceContext,
        store: JobStore,
        backend: ClusterBackend,
        me: str,
        lease_seconds: float,
        retry: Check | None = None,
    ) -> None:
        self.ctx = ctx
        self.store = store
        self.backend = backend
        self.me = me
        self.lease_seconds = lease_seconds
        self.retry = retry
        self._rechecks: dict[str, asyncio.Task[None]] = {}

    async def carry_out(self, record: JobRecord, previous: JobPhase | None) -> None:
        """Steps 1-3 now; 4-6 now or, after a backoff, in a background task.

        ``previous`` is the phase before the decision (None when finishing a plan
        decided earlier). Raises what the bus or the backend raises; the plan then
        stays undispatched for a retry.
        """
        plan = record.pending_recovery
        assert plan is not None
        bus = self.ctx.bus
        started = RecoveryStarted(
            id=command_id("recovery-started", record.name, 0, plan.to_generation, record.uid),
            source=bus.source,
            job=record.name,
            generation=plan.to_generation,
            fault_id=plan.fault_id,
            level=plan.level,
            reason=plan.reason,
            from_generation=plan.from_generation,
            to_generation=plan.to_generation,
        )
        # Steps 1 and 2 in one publishing window (sent in order on one connection, so
        # stored in that order; one round trip of acks instead of one per step).
        messages: list[tuple[str, Envelope]] = []
        if not plan.resize:  # a resize was announced by the scaler (ScaleDecided)
            messages.append((bus.subjects.action(record.name), started))
        phase = phase_message(bus, previous, record)
        if phase is not None:
            messages.append(phase)
        if plan.resize:
            messages += stop_messages(
                bus, record, plan.from_generation, plan.reason, placements=plan.stop_placements
            )
        elif plan.level is not RecoveryLevel.IN_PROCESS:
            why = f"{plan.level.value} restart after {plan.fault_id}"
            messages += stop_messages(
                bus,
                record,
                plan.from_generation,
                why,
                placements=plan.stop_placements,
                hung_ranks=plan.hung_ranks,
            )
        delay = (plan.start_at - datetime.now(UTC)).total_seconds()
        if delay <= 0 and not _changes_cluster(record):
            # Nothing happens between the stops and the new generation: step 5's
            # Assigns follow in the same window (after the Stops on each replica's
            # subject), and the plan is marked dispatched once all are stored.
            await self._start_generation(record, first=messages)
            return
        await publish_all(bus, messages)
        await self._change_cluster(record)
        delay = (plan.start_at - datetime.now(UTC)).total_seconds()
        if delay <= 0:
            await self._start_generation(record)
        else:
            self.ctx.log.info(
                "job %s: generation %d starts in %.1f s (backoff)",
                record.name,
                plan.to_generation,
                delay,
                extra={"job": record.name},
            )
            self.ctx.spawn(self._after(delay, record))

    async def _change_cluster(self, record: JobRecord) -> None:
        """Step 3: cordons, moves, recreations and a requeue's deletions."""
        plan = record.pending_recovery
        assert plan is not None
        for node in plan.cordon:
            await self.backend.cordon(node, reason=f"{plan.reason} ({plan.fault_id})")
        placements = {p.replica: p for p in record.placements}
        for move in plan.moves:
            await self.backend.delete_worker_group(record.name, move.replica, move.from_node)
            await self.backend.create_worker_group(worker_group(record, placements[move.replica]))
        for replica in plan.recreate:
            if replica in placements:
                await self.backend.create_worker_group(worker_group(record, placements[replica]))
        if plan.requeue or plan.resize:
            staying = {(p.replica, p.node) for p in record.placements}
            for p in plan.stop_placements:
                if (p.replica, p.node) not in staying:
                    await self.backend.delete_worker_group(record.name, p.replica, p.node)

    async def _after(self, delay: float, record: JobRecord) -> None:
        await asyncio.sleep(delay)
        try:
            await self._start_generation(record)
        except Exception:
            self.ctx.log.exception(
                "starting the new generation of %s failed; retrying", record.name
            )
            if self.retry is not None:
                when = datetime.now(UTC) + timedelta(seconds=self.lease_seconds)
                self.recheck_at(record.name, when, self.retry)

    async def _start_generation(
        self, record: JobRecord, first: list[tuple[str, Envelope]] | None = None
    ) -> None:
        """Steps 5 and 6: Assign to every replica (none for a requeue; after ``first``,
        in one publishing window), then dispatched."""
        plan = record.pending_recovery
        assert plan is not None
        messages = list(first or ())
        if not plan.requeue:
            level = plan.level if plan.level is RecoveryLevel.IN_PROCESS else None
            messages += assignment_messages(self.ctx.bus, record, level)
        await publish_all(self.ctx.bus, messages)
        await self.store.mutate(record.name, lambda r: mark_dispatched(r, plan.to_generation))

    def recheck_at(self, name: str, when: datetime, check: Check, purpose: str = "") -> None:
        """Call ``check(name)`` at ``when`` (one pending check per job and ``purpose``; a
        later call wins)."""
        slot = f"{purpose}:{name}"
        previous = self._rechecks.pop(slot, None)
        if previous is not None:
            previous.cancel()

        async def later() -> None:
            await asyncio.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()) + 0.05)
            self._rechecks.pop(slot, None)
            await check(name)

        self._rechecks[slot] = self.ctx.spawn(later(), name="recheck")

    async def watch_records(
        self,
        on_record: Callable[[JobRecord], Awaitable[None]],
        seen: Callable[[str, JobRecord | None], None] | None = None,
    ) -> None:
        """Hand every job record written from now on whose plan is undispatched and
        claimed by another instance to ``on_record`` (in a background task); ``seen``
        gets every record as it is written (None: the job's record was deleted). The
        store remembers each, so a fault's decision starts without reading its record."""
        watcher = await self.store.kv.watchall()
        self.ctx.exit_stack.push_async_callback(watcher.stop)

        async def pump() -> None:
            async for entry in watcher:
                if entry is None:
                    continue
                if not entry.value:
                    self.store.forget(unescape_token(entry.key))
                    if seen is not None:
                        seen(unescape_token(entry.key), None)
                    continue
                with contextlib.suppress(ValueError):  # a record of a newer schema
                    record = JobRecord.model_validate_json(entry.value)
                    if entry.revision is not None:
                        self.store.remember(record, entry.revision)
                    if seen is not None:
                        seen(record.name, record)
                    plan = record.pending_recovery
                    if plan is not None and not plan.dispatched and plan.claimed_by != self.me:
                        try:
                            await on_record(record)
                        except Exception:
                            self.ctx.log.exception("taking over %s's recovery failed", record.name)

        self.ctx.spawn(pump, name="watch_records")
