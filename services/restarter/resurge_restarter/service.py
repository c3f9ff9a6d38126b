"""The restarter service: faults in, new generations out, at the cheapest level that works.

On a fault: decide (see :mod:`resurge_restarter.policy`) and write the decision and its
plan into the job record with one compare-and-set, claimed by this instance; only then
carry the plan out (:mod:`resurge_restarter.dispatch`): RecoveryStarted, Stop(g) to the
old placements, cordons, moved and recreated worker groups, the backoff wait,
Assign(g+1); then mark the plan dispatched. Every step is idempotent, and commands
carry ids derived from (job, replica, generation), so carrying a plan out twice sends
nothing new.

Crash safety: a plan not marked dispatched is carried out by whichever restarter sees
it once its claim has lapsed (``claimed_until``, the backoff plus a short lease): on
start-up every record is checked, and a watch on the job records sees plans written
by others. Two restarters share the fault consumer (a queue group); the
compare-and-set lets one decision win, and the claim lets one instance carry it out.

The new generation's first completed step (its first worker start, for workers that
report no progress) closes the recovery and records its duration. Checkpoint reports
are counted into the job record.
"""

from __future__ import annotations

from datetime import UTC, datetime

from resurge.cluster.local import LocalBackend
from resurge.control.job_messages import announce_phase, send_stops
from resurge.control.records import JobRecord, JobStore
from resurge.events import (
    CheckpointSaved,
    FaultDetected,
    FaultScope,
    ProcessStarted,
    Progress,
    RecoveryFinished,
)
from resurge.runtime.service import ServiceContext
from resurge_restarter.dispatch import Dispatcher, cluster_view
from resurge_restarter.policy import (
    ClusterView,
    Decision,
    Verdict,
    apply_checkpoint,
    apply_fault,
    apply_progress_capability,
    apply_sign_of_life,
    claim,
)

__all__ = ["setup"]

LEASE_SECONDS = 3.0


async def setup(ctx: ServiceContext) -> None:
    bus = ctx.bus
    store = JobStore(await bus.jobs_bucket())
    backend = await LocalBackend.open(bus)
    me = bus.source.instance
    dispatcher = Dispatcher(ctx, store, backend, me, LEASE_SECONDS)

    async def on_fault(fault: FaultDetected) -> None:
        if fault.job is None:
            return
        found = await store.get(fault.job)
        if found is None:
            ctx.log.warning("fault for unknown job %s ignored", fault.job, extra={"job": fault.job})
            return
        cluster: ClusterView | None = None
        if fault.scope is FaultScope.NODE or any(e.node_scoped for e in found[0].history):
            cluster = await cluster_view(backend, exclude_job=fault.job)
        decision: Decision | None = None

        def change(record: JobRecord) -> bool:
            nonlocal decision
            decision = apply_fault(
                record,
                fault,
                now=datetime.now(UTC),
                cluster=cluster,
                claimant=me,
                lease_seconds=LEASE_SECONDS,
            )
            return decision.verdict is not Verdict.IGNORE

        result = await store.mutate(fault.job, change)
        if result is None:
            return
        before, after = result
        if decision is None or decision.verdict is Verdict.IGNORE:
            ctx.log.info("fault %s ignored: %s", fault.fault_id, decision and decision.why)
            plan = after.pending_recovery
            if plan is not None and plan.fault_id == fault.fault_id and not plan.dispatched:
                await take_over(after)  # redelivered: an earlier attempt stopped part-way
            return
        if decision.verdict is Verdict.FAIL:
            pending.pop(after.name, None)
            ctx.log.error("job %s failed: %s", after.name, decision.why, extra={"job": after.name})
            await send_stops(bus, after, after.generation, decision.why, final=True)
            await announce_phase(bus, before.phase, after)
            return
        assert after.pending_recovery is not None
        pending[after.name] = after.pending_recovery.to_generation
        ctx.log.warning(
            "restarting %s at level %s: generation %d -> %d (%s)",
            after.name,
            decision.level.value,
            before.generation,
            after.generation,
            fault.reason,
            extra={"job": after.name, "generation": after.generation},
        )
        await dispatcher.carry_out(after, before.phase)

    # Jobs with a recovery in flight (job -> generation being started), jobs known to
    # report progress, and the newest generation of each seen past its resume point:
    # other progress events need no record read.
    pending: dict[str, int] = {}
    reporting: set[str] = set()
    progressed: dict[str, int] = {}

    async def sign_of_life(event: ProcessStarted | Progress) -> None:
        if event.job is None or event.generation is None:
            return
        progress = isinstance(event, Progress)
        if (
            progress
            and event.job in reporting
            and pending.get(event.job) != event.generation
            and progressed.get(event.job, -1) >= event.generation
        ):
            return
        generation = event.generation
        in_process = isinstance(event, Progress) and event.in_process
        step = event.step if isinstance(event, Progress) else None

        def change(record: JobRecord) -> bool:
            capable = progress and apply_progress_capability(record, in_process)
            alive = apply_sign_of_life(record, generation, event.time, progress=progress, step=step)
            return capable or alive

        result = await store.mutate(event.job, change)
        if result is None:
            return
        before, after = result
        if after.reports_progress:
            reporting.add(after.name)
        if after.progressed_generation is not None:
            progressed[after.name] = after.progressed_generation
        if before.pending_recovery is None or after.pending_recovery is not None:
            return
        pending.pop(after.name, None)
        assert after.last_recovery_seconds is not None
        ctx.log.info(
            "job %s recovered in %.3f s",
            after.name,
            after.last_recovery_seconds,
            extra={"job": after.name, "generation": after.generation},
        )
        finished = RecoveryFinished(
            source=bus.source,
            job=after.name,
            generation=after.generation,
            fault_id=before.pending_recovery.fault_id,
            level=before.pending_recovery.level,
            reason=before.pending_recovery.reason,
            duration_seconds=after.last_recovery_seconds,
        )
        await bus.publish(bus.subjects.action(after.name), finished)
        await announce_phase(bus, before.phase, after)

    async def on_checkpoint(event: CheckpointSaved) -> None:
        if event.job is None or event.rank is None:
            return
        rank = event.rank
        result = await store.mutate(
            event.job, lambda r: apply_checkpoint(r, rank, event.step, event.path)
        )
        if result is not None and result[0].latest_checkpoint != result[1].latest_checkpoint:
            ctx.log.info("job %s: every rank saved step %d", event.job, event.step,
                         extra={"job": event.job})  # fmt: skip

    async def take_over(record: JobRecord) -> None:
        """Carry out ``record``'s plan if it is undispatched and its claim has lapsed."""
        plan = record.pending_recovery
        if plan is None or plan.dispatched:
            return
        pending[record.name] = plan.to_generation
        now = datetime.now(UTC)
        if plan.claimed_by != me and plan.claimed_until is not None and now < plan.claimed_until:
            dispatcher.recheck_at(record.name, plan.claimed_until, take_over_by_name)
            return
        result = await store.mutate(record.name, lambda r: claim(r, me, now, LEASE_SECONDS))
        if result is None or result[0] is result[1]:
            return
        ctx.log.warning(
            "carrying out %s's unfinished recovery to generation %d (claimed by %s until %s)",
            record.name, plan.to_generation, plan.claimed_by or "nobody",
            plan.claimed_until, extra={"job": record.name},
        )  # fmt: skip
        await dispatcher.carry_out(result[1], None)

    async def take_over_by_name(name: str) -> None:
        found = await store.get(name)
        if found is not None:
            await take_over(found[0])

    dispatcher.retry = take_over_by_name
    for record in await store.all():
        await take_over(record)
    await dispatcher.watch_records(take_over)

    await bus.consume(bus.subjects.all("fault"), "restarter", on_fault, expects=(FaultDetected,))
    await bus.consume(
        bus.subjects.raw(None, "process_started", None),
        "restarter-sign-of-life",
        sign_of_life,
        expects=(ProcessStarted,),
    )
    await bus.consume(
        bus.subjects.raw(None, "progress", None),
        "restarter-progress",
        sign_of_life,
        expects=(Progress,),
        start="new",
    )
    await bus.consume(
        bus.subjects.raw(None, "checkpoint_saved", None),
        "restarter-checkpoints",
        on_checkpoint,
        expects=(CheckpointSaved,),
    )
