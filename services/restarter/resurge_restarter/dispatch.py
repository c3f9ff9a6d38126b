"""Carrying out a recovery plan (``JobRecord.pending_recovery``), idempotently.

:meth:`Dispatcher.carry_out` runs the plan's steps in order, each safe to repeat:

1. RecoveryStarted and PhaseChanged on ``action.<job>`` (ids derived from the job and
   generation, so a repeat is de-duplicated by JetStream);
2. Stop(g) to where the failed generation ran (for ``in_process``, only to the
   replicas that go: the others stay and re-enter their training function); for a
   resize, to ``stop_placements`` only (the replicas that go, or every replica where
   the workers cannot re-enter in-process), and no RecoveryStarted (the scaler
   announced it with ScaleDecided);
3. cordons; moved replicas' worker groups deleted on the old node and created on the
   new one; recreated (for a resize: added) replicas' worker groups written; the worker
   groups of stopped placements the record no longer places deleted (a requeue's, a
   resize's removed replicas, those of a plan this one replaced);
4. the backoff wait and the plan's GPU resets (in a background task, so the fault
   consumer is never held: :mod:`.gpu_resets`; a reset that failed leaves the plan to
   the fault its failure raises), after which the record is read again: a plan replaced
   meanwhile sends nothing more;
5. Assign(g+1) to every replica (ids derived from job, replica and generation); where
   nothing happens between step 2 and this one (no cordon, move, recreated worker group,
   GPU reset or backoff) and the plan starts exactly the replicas it stops, each replica's Stop is
   folded into its Assign (``Assign.stop``): one command per replica, sent with step 1;
6. the plan marked dispatched (compare-and-set).

A restarter that dies or fails anywhere in there leaves the plan undispatched; the
next restarter to look (this one's reconciler included, :mod:`.reconcile`) carries it
out again from step 1 once the claim has lapsed. A plan replaced before it was
dispatched passes what it still owed to the plan that replaced it
(:func:`resurge.control.decisions.recovery_policy.supersede`). The cluster is reached only
through :class:`~resurge.cluster.ClusterBackend`, whose writes are idempotent too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from resurge.cluster import ClusterBackend
from resurge.contract.subjects import unescape_token
from resurge.control.decisions.planner import command_id
from resurge.control.decisions.recovery_policy import claim, mark_dispatched, same_plan
from resurge.control.decisions.worker_groups import worker_group
from resurge.control.effects.job_messages import (
    assignment_messages,
    phase_message,
    publish_all,
    stop_messages,
)
from resurge.control.state.records import JobRecord, JobStore, PendingRecovery, Placement
from resurge.events import Envelope, JobPhase, RecoveryLevel, RecoveryStarted, StopFirst
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge_restarter.gpu_resets import reset_plan_gpus

__all__ = ["Dispatcher"]

Check = Callable[[str], Awaitable[None]]
"""Called with a job's name: look at its record again."""


def _leaving(record: JobRecord) -> list[Placement]:
    """The placements ``record``'s plan stops that the record no longer places (a
    requeue's, a resize's removed replicas, a moved replica's old node, those of a plan
    it replaced): their worker groups are deleted."""
    plan = record.pending_recovery
    assert plan is not None
    staying = {(p.replica, p.node) for p in record.placements}
    return [p for p in plan.stop_placements if (p.replica, p.node) not in staying]


def _still_planned(record: JobRecord | None, plan: PendingRecovery, uid: str, me: str) -> bool:
    """Whether ``record`` (as read now) still holds ``plan`` of run ``uid``, undispatched
    and claimed by ``me``: one replaced meanwhile is not to be sent."""
    current = None if record is None else record.pending_recovery
    if record is None or current is None or record.uid != uid:
        return False
    return not current.dispatched and current.claimed_by == me and same_plan(current, plan)


def _stop_first(record: JobRecord) -> StopFirst | None:
    """What the Assigns of ``record``'s plan stop first, where the plan stops exactly the
    replicas it starts, on the same nodes, at a level that stops processes: the Stop each
    replica would get, folded into its Assign; else None (the Stops go on their own)."""
    plan = record.pending_recovery
    assert plan is not None
    same = {(p.replica, p.node) for p in plan.stop_placements} == {
        (p.replica, p.node) for p in record.placements
    }
    if plan.resize or plan.requeue or plan.level is RecoveryLevel.IN_PROCESS or not same:
        return None
    return StopFirst(
        generation=plan.from_generation,
        timeout_seconds=record.spec.spec.recovery.stop_grace_seconds,
        hung_ranks=plan.hung_ranks,
        reason=f"{plan.level.value} restart after {plan.fault_id}",
    )


def _own_stops(bus: Bus, record: JobRecord) -> list[tuple[str, Envelope]]:
    """Step 2's Stops, on their own (module docstring)."""
    plan = record.pending_recovery
    assert plan is not None
    if plan.resize:
        return stop_messages(
            bus, record, plan.from_generation, plan.reason, placements=plan.stop_placements
        )
    elif plan.level is not RecoveryLevel.IN_PROCESS:
        why = f"{plan.level.value} restart after {plan.fault_id}"
        return stop_messages(
            bus,
            record,
            plan.from_generation,
            why,
            placements=plan.stop_placements,
            hung_ranks=plan.hung_ranks,
        )
    elif leaving := _leaving(record):  # in-process: only replicas that go stop
        why = f"{plan.level.value} restart after {plan.fault_id}"
        return stop_messages(bus, record, plan.from_generation, why, placements=leaving)
    return []


def _changes_cluster(record: JobRecord) -> bool:
    """Whether step 3 has anything to do for ``record``'s plan."""
    plan = record.pending_recovery
    assert plan is not None
    if plan.cordon or plan.moves or plan.requeue or plan.resize or _leaving(record):
        return True
    placed = {p.replica for p in record.placements}
    return any(replica in placed for replica in plan.recreate)


class Dispatcher:
    """Carries plans out for one restarter instance (``me``), and schedules re-checks."""

    def __init__(
        self,
        ctx: ServiceContext,
        store: JobStore,
        backend: ClusterBackend,
        me: str,
        lease_seconds: float,
    ) -> None:
        self.ctx = ctx
        self.store = store
        self.backend = backend
        self.me = me
        self.lease_seconds = lease_seconds
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
        delay = (plan.start_at - datetime.now(UTC)).total_seconds()
        # Nothing happens between the stops and the new generation: each replica gets one
        # Assign that stops its old workers first (where the plan stops exactly the
        # replicas it starts), in the same window as step 1, and the plan is marked
        # dispatched once all are stored.
        resets = any(r.node in {p.node for p in record.placements} for r in plan.reset_gpus)
        at_once = delay <= 0 and not _changes_cluster(record) and not resets
        folded = _stop_first(record) if at_once else None
        if folded is None:  # else the Assigns carry it
            messages += _own_stops(bus, record)
        if at_once:
            await self._start_generation(record, first=messages, stop=folded)
            return
        await publish_all(bus, messages)
        await self._change_cluster(record)
        delay = (plan.start_at - datetime.now(UTC)).total_seconds()
        if resets:
            self.ctx.spawn(self._after(delay, record, reset=True))
        elif delay <= 0:
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
        """Step 3: cordons, moves, recreations, and the deletions of the worker groups
        of replicas that go (:func:`_leaving`)."""
        plan = record.pending_recovery
        assert plan is not None
        for node in plan.cordon:
            await self.backend.cordon(node, reason=f"{plan.reason} ({plan.fault_id})")
        placements = {p.replica: p for p in record.placements}
        for move in plan.moves:
            await self.backend.delete_worker_group(record.name, move.replica, move.from_node)
            if move.replica in placements:  # a requeue after it placed it nowhere
                placed = placements[move.replica]
                await self.backend.create_worker_group(worker_group(record, placed))
        for replica in plan.recreate:
            if replica in placements:
                await self.backend.create_worker_group(worker_group(record, placements[replica]))
        moved = {(m.replica, m.from_node) for m in plan.moves}
        for p in _leaving(record):
            if (p.replica, p.node) not in moved:
                await self.backend.delete_worker_group(record.name, p.replica, p.node)

    async def _after(self, delay: float, record: JobRecord, reset: bool = False) -> None:
        """Steps 5 and 6 once the backoff ran out (and, with ``reset``, the plan's GPUs
        were reset), for the plan the record holds then: one replaced meanwhile (a fault
        decided anew, and the new plan took over what this one still owed) sends
        nothing. A failure leaves the plan undispatched; it is taken over once its claim
        lapses (the restarter's reconciler)."""
        plan = record.pending_recovery
        assert plan is not None
        await asyncio.sleep(max(0.0, delay))
        try:
            bound = self.ctx.settings.gpu_reset_timeout_seconds
            if reset and not await self._hold_claim(record, plan, bound):
                return  # replaced meanwhile, or taken over
            if reset and not await reset_plan_gpus(self.ctx.bus, record, bound, self.ctx.log):
                self.ctx.log.warning(
                    "job %s: a GPU reset failed; generation %d waits for the fault that "
                    "moves it off the node",
                    record.name,
                    plan.to_generation,
                    extra={"job": record.name},
                )
                return
            found = await self.store.get(record.name)
            now = None if found is None else found[0]
            if now is None or not _still_planned(now, plan, record.uid, self.me):
                self.ctx.log.info(
                    "job %s: the plan to generation %d was replaced in its backoff; not sent",
                    record.name,
                    plan.to_generation,
                    extra={"job": record.name},
                )
                return
            await self._start_generation(now)
        except Exception:
            self.ctx.log.exception(
                "starting generation %d of %s failed; it is taken over once its claim lapses",
                plan.to_generation,
                record.name,
                extra={"job": record.name},
            )

    async def _hold_claim(self, record: JobRecord, plan: PendingRecovery, bound: float) -> bool:
        """Claim ``plan`` for the GPU resets' wait (``bound`` seconds) and the lease
        after it, so no instance takes it over meanwhile; False if it is not ours now."""
        lease = self.lease_seconds + bound
        now = datetime.now(UTC)
        result = await self.store.mutate(
            record.name, lambda r: claim(r, self.me, now, lease, expected=plan)
        )
        return result is not None and result[0] is not result[1]

    async def _start_generation(
        self,
        record: JobRecord,
        first: list[tuple[str, Envelope]] | None = None,
        stop: StopFirst | None = None,
    ) -> None:
        """Steps 5 and 6: Assign to every replica (none for a requeue; after ``first``,
        in one publishing window; each stopping ``stop`` first), then dispatched."""
        plan = record.pending_recovery
        assert plan is not None
        messages = list(first or ())
        if not plan.requeue:
            level = plan.level if plan.level is RecoveryLevel.IN_PROCESS else None
            messages += assignment_messages(self.ctx.bus, record, level, stop)
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

    async def watch_records(self, seen: Callable[[str, JobRecord | None], None]) -> None:
        """Hand every job record, as it is now and as it is written from now on, to
        ``seen`` (in a background task; None: the job's record was deleted), this
        instance's own writes too. The store remembers each, so a fault's decision
        starts without reading its record."""
        watcher = await self.store.kv.watchall()
        self.ctx.exit_stack.push_async_callback(watcher.stop)

        async def pump() -> None:
            async for entry in watcher:
                if entry is None:
                    continue
                if not entry.value:
                    self.store.forget(unescape_token(entry.key))
                    seen(unescape_token(entry.key), None)
                    continue
                with contextlib.suppress(ValueError):  # a record of a newer schema
                    record = JobRecord.from_entry(entry.value)
                    if entry.revision is not None:
                        self.store.remember(record, entry.revision)
                    seen(record.name, record)

        self.ctx.spawn(pump, name="watch_records")
