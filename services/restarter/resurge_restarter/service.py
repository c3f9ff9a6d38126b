"""The restarter service: faults in, new generations out, at the cheapest level that works.

Every fault is also counted against its node, across jobs (:mod:`.node_ledger`): a
node whose score reaches the threshold is quarantined, the jobs on it moved off.

On a fault: decide (see :mod:`resurge.control.decisions.recovery_policy`) and write the
decision and its plan into the job record with one compare-and-set, claimed by this
instance; only then carry the plan out (:mod:`resurge_restarter.dispatch`):
RecoveryStarted, Stop(g) to the old placements, cordons, moved and recreated worker
groups, the backoff wait, Assign(g+1); then mark the plan dispatched. Every step is
idempotent, and commands carry ids derived from (job, replica, generation), so carrying
a plan out twice sends nothing new.

A fault that fails the job writes the phase and the job's last steps
(:mod:`resurge.control.decisions.job_end`) in one compare-and-set, then does them: the final
Stops, the phase announced, the worker groups deleted, each marked done in the record.

Crash and failure safety: every side effect follows from the record
(:mod:`.reconcile`). A plan not marked dispatched, and a finished job's last steps not
marked done, are carried out by whichever restarter looks once their claim has lapsed
(``claimed_until``, the backoff plus a short lease): on start-up every record is
looked at, and a watch on the job records (this instance's own writes included) keeps
the time of the next look; a look that fails is tried again. So a carrying-out that
failed after the fault's last redelivery, or an instance that died, is finished
later, with no new event. Two restarters share the fault consumer (a queue group);
the compare-and-set lets one decision win, and the claim lets one instance carry it
out.

A recovery ends when the new generation trained (:mod:`resurge.control.decisions.recovery_policy`):
its first completed step, or for workers that report no progress its ranks passing
their rendezvous (``rendezvous_passed``, from the agent hosting the generation's store);
a worker that exits 0 ends it too (it did its work); a worker start ends none. For a
job none of whose generations ever passed a rendezvous
(its scripts never join the agent's store) a check ``SETTLE_SECONDS`` after the new
generation's first worker start ends it, if no fault came first. The duration is
recorded and announced (``RecoveryFinished``). Checkpoint reports
are counted into the job record, and so is where the current generation's ranks took
their registered state from (``StateRestored``; the job's status shows it).

:func:`setup` is what the service runner calls: it opens the job store and the cluster
backend (:func:`resurge.cluster.open_backend`) and starts a :class:`Restarter`.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import TypeVar

from resurge.cluster import ClusterBackend, open_backend
from resurge.contract.subscriptions import (
    RESTARTER_CHECKPOINTS,
    RESTARTER_EXITS,
    RESTARTER_FAULTS,
    RESTARTER_NODE_CHECKS,
    RESTARTER_NODE_FAULTS,
    RESTARTER_PROGRESS,
    RESTARTER_RENDEZVOUS,
    RESTARTER_RESTORED,
    RESTARTER_SIGN_OF_LIFE,
)
from resurge.control.decisions.job_end import claim_ending
from resurge.control.decisions.recovery_policy import (
    ClusterView,
    Decision,
    Verdict,
    apply_checkpoint,
    apply_fault,
    apply_progress_capability,
    apply_rendezvous,
    apply_settled,
    apply_sign_of_life,
    apply_worker_succeeded,
    claim,
    settle_due,
)
from resurge.control.decisions.restore_reports import apply_restored
from resurge.control.effects.job_finish import finish_job
from resurge.control.effects.job_messages import announce_phase
from resurge.control.state.allocations import Claim
from resurge.control.state.node_health import NodeHealthStore
from resurge.control.state.records import JobRecord, JobStore
from resurge.events import (
    CheckpointSaved,
    Event,
    FaultDetected,
    FaultScope,
    JobPhase,
    ProcessExited,
    ProcessStarted,
    Progress,
    RecoveryFinished,
    RendezvousPassed,
    StateRestored,
)
from resurge.runtime.bus import TransientError
from resurge.runtime.service import ServiceContext
from resurge_restarter.dispatch import Dispatcher
from resurge_restarter.known_jobs import KnownJobs
from resurge_restarter.metrics import RestarterMetrics
from resurge_restarter.node_evictions import EvictionWatch
from resurge_restarter.node_ledger import NodeLedger
from resurge_restarter.placing import MovePlacer, covered
from resurge_restarter.reconcile import Reconciler, next_look
from resurge_restarter.warm_up import warm_up

__all__ = ["LEASE_SECONDS", "Restarter", "setup"]

# How long past its backoff a plan stays claimed by the instance that decided it;
# after that any restarter may carry it out.
LEASE_SECONDS = 3.0


class Restarter:
    """One restarter instance: its bus handlers and what it remembers between events.

    ``me`` is the name it claims plans under (the bus's source instance unless given).
    """

    def __init__(
        self,
        ctx: ServiceContext,
        backend: ClusterBackend,
        store: JobStore,
        *,
        me: str | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self.ctx = ctx
        self.bus = ctx.bus
        self.backend = backend
        self.store = store
        self.me = me or ctx.bus.source.instance
        self.lease_seconds = lease_seconds
        self.dispatcher = Dispatcher(ctx, store, backend, self.me, lease_seconds)
        self.reconciler = Reconciler(ctx, self.reconcile, lease_seconds)
        self.placer = MovePlacer(ctx.bus, backend, store, self.me)
        # Jobs with a recovery in flight (job -> generation being started; an entry lives
        # while its recovery does), and, bounded (:mod:`.known_jobs`), jobs known to
        # report progress and the newest generation of each seen past its resume point:
        # other progress events need no record read.
        self.pending: dict[str, int] = {}
        self.known = KnownJobs(ctx.registry)
        self.metrics = RestarterMetrics(ctx.registry)

    async def start(self) -> None:
        """Warm the fault path (:mod:`.warm_up`), look at what every record owes, watch
        the records, then consume events."""
        warm_up(self.bus, self.me)
        self.reconciler.start()
        await self.resume_unfinished()
        await self.dispatcher.watch_records(self._record_seen)
        bus = self.bus
        await bus.bind(RESTARTER_FAULTS, self.on_fault)
        nodes = await bus.node_health_bucket()
        assert nodes is not None
        self.ledger = NodeLedger(
            self.ctx, self.backend, NodeHealthStore(nodes), self.store, self.on_fault
        )
        await self.ledger.watch()
        EvictionWatch(self.ctx, self.backend, NodeHealthStore(nodes), self.store).start()
        await bus.bind(RESTARTER_NODE_FAULTS, self.ledger.on_fault)
        await bus.bind(RESTARTER_NODE_CHECKS, self.ledger.checks.on_checked)
        await bus.bind(RESTARTER_SIGN_OF_LIFE, self.sign_of_life)
        await bus.bind(RESTARTER_RENDEZVOUS, self.on_rendezvous)
        await bus.bind(RESTARTER_EXITS, self.on_exit)
        # Every rank's steps and checkpoints of every job: read in batches with one ack
        # per batch, so a busy cluster's progress does not crowd out the fault consumer
        # above, and a job's checkpoint reports are counted a batch per record write.
        await bus.bind(RESTARTER_PROGRESS, self.on_progress)
        await bus.bind(RESTARTER_CHECKPOINTS, self.on_checkpoints)
        await bus.bind(RESTARTER_RESTORED, self.on_restored)

    async def resume_unfinished(self) -> None:
        """Look at every job record once: schedule the look at what it owes (an
        undispatched plan, a finished job's last steps; at once where no claim holds
        them), and the settle check of a recovery that only settling can end."""
        for record in await self.store.all():
            self.reconciler.note(record.name, next_look(record))
            due = settle_due(record)
            if due is not None:
                self.dispatcher.recheck_at(record.name, due, self.settle, "settle")

    async def on_fault(self, fault: FaultDetected) -> None:
        """:meth:`decide_and_carry_out`; the slots claimed for its moves are dropped once
        that created their worker groups (or failed), not before: a job deleted
        meanwhile must not see its slots handed out under a group about to be made."""
        try:
            await self.decide_and_carry_out(fault)
        finally:
            await self.placer.release_held(fault.fault_id)

    async def decide_and_carry_out(self, fault: FaultDetected) -> None:
        """Decide, write the decision and its plan (compare-and-set), then carry it out.

        A redelivered fault whose plan is still undispatched (an earlier attempt
        stopped part-way) has the plan carried out again; one that failed the job has
        the job's last steps that are not done yet done again.
        """
        if fault.job is None:
            return
        self._meter_fault(fault)
        found = self.store.remembered(fault.job) or await self.store.get(fault.job)
        if found is None:
            self.ctx.log.warning(
                "fault for unknown job %s ignored", fault.job, extra={"job": fault.job}
            )
            return
        result, decision = await self._decide(fault, found[0])
        if result is None:
            return
        before, after = result
        if decision is None or decision.verdict is Verdict.IGNORE:
            self.ctx.log.info("fault %s ignored: %s", fault.fault_id, decision and decision.why)
            plan = after.pending_recovery
            if plan is not None and plan.fault_id == fault.fault_id and not plan.dispatched:
                await self.take_over(after)  # redelivered: an earlier attempt stopped part-way
            ending = after.ending
            if ending is not None and not ending.done and fault.fault_id in after.handled_faults:
                await self.finish(after)  # the same, for the steps of a job it failed
            return
        if decision.verdict is Verdict.FAIL:
            self.pending.pop(after.name, None)
            self.ctx.log.error(
                "job %s failed: %s", after.name, decision.why, extra={"job": after.name}
            )
            await finish_job(self.bus, self.backend, self.store, after)
            return
        assert after.pending_recovery is not None
        self.pending[after.name] = after.pending_recovery.to_generation
        # The commands first: the count and the log line wait for them, not they for it.
        try:
            await self.dispatcher.carry_out(after, before.phase)
        finally:
            self.metrics.restarted(decision.level, fault.reason)
            self.metrics.meter.recovering(after.name, fault.time)
            self.ctx.log.warning(
                "restarting %s at level %s: generation %d -> %d (%s)",
                after.name,
                decision.level.value,
                before.generation,
                after.generation,
                fault.reason,
                extra={"job": after.name, "generation": after.generation},
            )

    async def _decide(
        self, fault: FaultDetected, known: JobRecord
    ) -> tuple[tuple[JobRecord, JobRecord] | None, Decision | None]:
        """Decide ``fault`` and write the decision (compare-and-set): the record before
        and after (None: no such job) and the decision (None: not decided)."""
        decisions: list[Decision] = []

        def decide(record: JobRecord, cluster: ClusterView | None) -> Decision:
            return apply_fault(
                record,
                fault,
                now=datetime.now(UTC),
                cluster=cluster,
                claimant=self.me,
                lease_seconds=self.lease_seconds,
                reached=self.known.reached(record.name, record.generation),
                gpu_resets=self.ctx.settings.gpu_reset,
            )

        # A fault that may move a replica decides on the one cluster snapshot and claims
        # the moves' slots first (:mod:`.placing`); any other restart touches neither.
        cluster: ClusterView | None = None
        claims: list[Claim] = []
        if fault.scope is FaultScope.NODE or any(e.node_scoped for e in known.history):
            cluster, claims = await self.placer.reserve(known, fault.fault_id, decide)  # held
        unclaimed = [False]

        def change(record: JobRecord) -> bool:
            decisions[:] = [decide(record, cluster)]
            acts = decisions[0].verdict is not Verdict.IGNORE
            unclaimed[0] = acts and not covered(record, fault.fault_id, claims)
            return acts and not unclaimed[0]

        result = await self.store.mutate(known.name, change)
        if unclaimed[0]:  # the record changed since the moves were claimed
            raise TransientError(f"{known.name}: moves not claimed; deciding again")
        return result, decisions[0] if decisions else None

    async def on_progress(self, events: list[Event]) -> None:
        """One batch of progress reports, each a sign of life, in the order they came."""
        for event in events:
            if isinstance(event, Progress):
                await self.sign_of_life(event)

    async def sign_of_life(self, event: ProcessStarted | Progress) -> None:
        """Record a worker start or a step; the new generation's first step closes its
        recovery (a worker start closes none)."""
        if event.job is None or event.generation is None:
            return
        progress = isinstance(event, Progress)
        if isinstance(event, Progress):
            self.known.set_reached(event.job, event.generation, event.step)
            if event.rank == 0:
                self.metrics.meter.step(event.job, event.step, event.time)
        if (
            progress
            and self.known.reports(event.job)
            and self.pending.get(event.job) != event.generation
            and self.known.progressed(event.job) >= event.generation
        ):
            return
        if not progress and self._start_known(event.job, event.generation):
            return
        generation = event.generation
        in_process = isinstance(event, Progress) and event.in_process
        step = event.step if isinstance(event, Progress) else None

        def change(record: JobRecord) -> bool:
            capable = progress and apply_progress_capability(record, in_process)
            alive = apply_sign_of_life(record, generation, event.time, progress=progress, step=step)
            return capable or alive

        result = await self.store.mutate(event.job, change)
        if result is None:
            return
        before, after = result
        if after.reports_progress:
            self.known.set_reports(after.name)
        if after.progressed_generation is not None:
            self.known.set_progressed(after.name, after.progressed_generation)
        await self._closed(before, after)

    def _start_known(self, job: str, generation: int) -> bool:
        """Whether a worker start of ``generation`` can change nothing: the remembered
        record (which may be stale, never ahead) already has a generation that began, or
        a newer one. Every worker of a job reports its start: at thousands of ranks, a
        no-op change of the whole record for each would cost the square of them."""
        known = self.store.remembered(job)
        if known is None:
            return False
        record = known[0]
        began = record.generation == generation and record.alive_since is not None
        return began or record.generation > generation

    async def on_rendezvous(self, event: RendezvousPassed) -> None:
        """Every rank of a generation passed its rendezvous: for workers that report no
        progress, the new generation trained, and its recovery ends."""
        if event.job is None or event.generation is None:
            return
        generation = event.generation
        self.metrics.meter.trained(event.job)
        result = await self.store.mutate(
            event.job, lambda r: apply_rendezvous(r, generation, event.time)
        )
        if result is not None:
            await self._closed(*result)

    async def on_exit(self, event: ProcessExited) -> None:
        """A worker exited: one that exited 0 on its own did its work, so a recovery to
        its generation ends (a crash is the detector's to report, as a fault)."""
        if event.job is None or event.generation is None:
            return
        if event.expected or not event.succeeded:
            return
        generation = event.generation
        # No record read for the exits at a job's end: the plan of a recovery was written
        # (and seen by the record watch) before the Assign that started the worker; the
        # instance that wrote it knows it without the watch.
        known = self.store.remembered(event.job)
        plan = None if known is None else known[0].pending_recovery
        planned = plan is not None and plan.to_generation == generation
        if known is not None and not planned and self.pending.get(event.job) != generation:
            return
        result = await self.store.mutate(
            event.job, lambda r: apply_worker_succeeded(r, generation, event.time)
        )
        if result is not None:
            await self._closed(*result)

    async def settle(self, name: str) -> None:
        """The fallback close of a recovery of a job whose scripts never join the agent's
        rendezvous store: its new generation ran ``SETTLE_SECONDS`` without a fault."""
        found = await self.store.get(name)
        if found is None or settle_due(found[0]) is None:
            return
        generation = found[0].generation
        result = await self.store.mutate(
            name, lambda r: apply_settled(r, generation, datetime.now(UTC)), read=found
        )
        if result is not None:
            await self._closed(*result)

    async def _closed(self, before: JobRecord, after: JobRecord) -> None:
        """Announce the recovery a change closed; if it is one that can only end by
        settling, look again when it may."""
        if before.pending_recovery is None or after.pending_recovery is not None:
            due = settle_due(after)
            if due is not None and before.alive_since is None:
                self.dispatcher.recheck_at(after.name, due, self.settle, "settle")
            return
        self.pending.pop(after.name, None)
        await self._finished(before, after)

    async def _finished(self, before: JobRecord, after: JobRecord) -> None:
        """Announce the recovery ``before`` had pending and ``after`` closed."""
        plan = before.pending_recovery
        assert plan is not None
        if plan.resize:
            resize = after.last_resize
            if resize is not None and resize.seconds is not None:
                self.metrics.meter.restarted(after.name, resize.seconds)
            self.ctx.log.info(
                "job %s runs generation %d at %d replica(s) (%s)",
                after.name,
                after.generation,
                len(after.placements),
                plan.reason,
                extra={"job": after.name, "generation": after.generation},
            )
            await announce_phase(self.bus, before.phase, after)
            return
        assert after.last_recovery_seconds is not None
        self.metrics.recovered(after.name, plan.level, after.last_recovery_seconds)
        self.ctx.log.info(
            "job %s recovered in %.3f s",
            after.name,
            after.last_recovery_seconds,
            extra={"job": after.name, "generation": after.generation},
        )
        finished = RecoveryFinished(
            source=self.bus.source,
            job=after.name,
            generation=after.generation,
            fault_id=plan.fault_id,
            level=plan.level,
            reason=plan.reason,
            duration_seconds=after.last_recovery_seconds,
        )
        await self.bus.publish(self.bus.subjects.action(after.name), finished)
        await announce_phase(self.bus, before.phase, after)

    def _meter_fault(self, fault: FaultDetected) -> None:
        """Count the detection time of a fault that names an exited worker."""
        if fault.job is None:
            return
        exited_at = fault.evidence.get("exited_at")
        exited = None
        if isinstance(exited_at, str):
            with contextlib.suppress(ValueError):
                exited = datetime.fromisoformat(exited_at)
        self.metrics.meter.fault(fault.job, fault.fault_id, fault.time, exited)

    def _record_seen(self, name: str, record: JobRecord | None) -> None:
        """Note when to look at what the record owes (:mod:`.reconcile`); follow a job's
        phase for its goodput; a deleted job's series go, and what was known of its
        progress (a job submitted again under its name is a new run)."""
        self.reconciler.note(name, None if record is None else next_look(record))
        if record is None:
            self.metrics.meter.forget(name)
            self.known.forget(name)
        else:
            self.metrics.meter.phase(name, record.phase, record.submitted, datetime.now(UTC))

    async def on_checkpoints(self, events: list[Event]) -> None:
        """Count a batch of ranks' saved checkpoints into their jobs' records, each with
        the reports of its own generation and world size: one write per job and batch
        (a write per report rewrote a record of every placement once per rank: the
        count of a job's N ranks cost N squared)."""
        for job, reports in _by_job(events, CheckpointSaved).items():
            await self._count_checkpoints(job, reports)

    async def _count_checkpoints(self, job: str, reports: list[CheckpointSaved]) -> None:
        def count(record: JobRecord) -> bool:
            changed = False
            for report in reports:
                assert report.rank is not None
                changed |= apply_checkpoint(
                    record,
                    report.rank,
                    report.step,
                    report.path,
                    generation=report.generation,
                    world_size=report.world_size,
                )
            return changed

        result = await self.store.mutate(job, count)
        if result is None:
            return
        before, after = result
        latest = after.latest_checkpoint
        if latest is not None and before.latest_checkpoint != latest:
            self.ctx.log.info(
                "job %s: every rank saved step %d",
                job,
                latest.step,
                extra={"job": job},
            )

    async def on_restored(self, events: list[Event]) -> None:
        """Record where ranks of their jobs' current generations took their state from:
        a batch of reports, one write per job (as :meth:`on_checkpoints`)."""
        for job, reports in _by_job(events, StateRestored).items():
            await self._fold_restored(job, reports)

    async def _fold_restored(self, job: str, reports: list[StateRestored]) -> None:
        def fold(record: JobRecord) -> bool:
            changed = False
            for r in reports:
                changed |= apply_restored(
                    record, r.generation, r.rank, r.step, r.origin, r.detail, r.sharded,
                    r.reshardable,
                )  # fmt: skip
            return changed

        result = await self.store.mutate(job, fold)
        if result is None or result[1].restored is None:
            return
        before, kept = result[0].restored, result[1].restored
        disk_before = (
            before is not None
            and before.generation == kept.generation
            and bool(before.ranks.get("disk"))
        )
        if disk_before or not kept.ranks.get("disk"):
            return  # said once a generation
        first = next(r for r in reports if r.origin == "disk")
        self.ctx.log.warning(
            "job %s generation %d resumed from the disk checkpoint of step %s: %s",
            job,
            kept.generation,
            first.step,
            first.detail,
            extra={"job": job, "generation": kept.generation},
        )

    async def take_over(self, record: JobRecord) -> None:
        """Carry out ``record``'s plan if it is undispatched, still the record's, and its
        claim has lapsed (or is ours); a claim another instance still holds is looked at
        again when it lapses."""
        plan = record.pending_recovery
        if plan is None or plan.dispatched:
            return
        self.pending[record.name] = plan.to_generation
        now = datetime.now(UTC)
        held = plan.claimed_until is not None and now < plan.claimed_until
        if plan.claimed_by != self.me and held:
            self.reconciler.note(record.name, plan.claimed_until)
            return
        result = await self.store.mutate(
            record.name, lambda r: claim(r, self.me, now, self.lease_seconds, expected=plan)
        )
        if result is None or result[0] is result[1]:
            return
        if plan.resize and not plan.claimed_by:
            self.ctx.log.info(
                "carrying out %s's resize to generation %d: %s",
                record.name,
                plan.to_generation,
                plan.reason,
                extra={"job": record.name},
            )
            await self.dispatcher.carry_out(result[1], JobPhase.RUNNING)
            return
        self.ctx.log.warning(
            "carrying out %s's unfinished recovery to generation %d (claimed by %s until %s)",
            record.name,
            plan.to_generation,
            plan.claimed_by or "nobody",
            plan.claimed_until,
            extra={"job": record.name},
        )
        await self.dispatcher.carry_out(result[1], None)

    async def finish(self, record: JobRecord) -> None:
        """Do the last steps of ``record``'s run that are not done yet, once their claim
        has lapsed (or is ours)."""
        now = datetime.now(UTC)

        def take(r: JobRecord) -> bool:
            return r.uid == record.uid and claim_ending(r, self.me, now, self.lease_seconds)

        result = await self.store.mutate(record.name, take)
        if result is None or result[0] is result[1]:
            return
        ending = result[0].ending
        assert ending is not None
        self.ctx.log.warning(
            "finishing %s's end as %s (claimed by %s until %s)",
            record.name,
            record.phase.value,
            ending.claimed_by or "nobody",
            ending.claimed_until,
            extra={"job": record.name},
        )
        await finish_job(self.bus, self.backend, self.store, result[1])

    async def reconcile(self, name: str) -> datetime | None:
        """The reconciler's look at job ``name`` (:mod:`.reconcile`): carry out what its
        record owes once no live claim holds it; when to look again (None: never)."""
        found = self.store.remembered(name) or await self.store.get(name)
        if found is None:
            return None
        record = found[0]
        due = next_look(record)
        if due is None or due > datetime.now(UTC):
            return due
        plan = record.pending_recovery
        if plan is not None and not plan.dispatched:
            await self.take_over(record)
        else:
            await self.finish(record)
        after = self.store.remembered(name)
        return None if after is None else next_look(after[0])


_Report = TypeVar("_Report", CheckpointSaved, StateRestored)


def _by_job(events: list[Event], kind: type[_Report]) -> dict[str, list[_Report]]:
    """The events of ``kind`` that name a job and a rank, by job, in their order."""
    found: dict[str, list[_Report]] = {}
    for event in events:
        if isinstance(event, kind) and event.job and event.rank is not None:
            found.setdefault(event.job, []).append(event)
    return found


async def setup(ctx: ServiceContext) -> None:
    """The service runner's entry point: open the store and backend, start a Restarter."""
    store = JobStore(await ctx.bus.jobs_bucket())
    backend = await open_backend(ctx.bus, ctx.settings)
    await Restarter(ctx, backend, store).start()
