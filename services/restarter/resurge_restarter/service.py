"""The restarter service: faults in, new generations out.

On a fault: decide and write the job record (compare-and-set), then send Stop(g) and
Assign(g+1) (with the newest checkpoint every rank saved) to every replica, or
Stop(final) when the job has failed. The new generation's first completed step (its
first worker start, for workers that report no progress) closes the recovery and
records its duration. Checkpoint reports are counted into the job record.
"""

from __future__ import annotations

from resurge.events import (
    CheckpointSaved,
    FaultDetected,
    ProcessStarted,
    Progress,
    RecoveryFinished,
    RecoveryStarted,
)
from resurge.job_commands import announce_phase, send_assignments, send_stops
from resurge.records import JobRecord, JobStore
from resurge.service import ServiceContext
from resurge_restarter.policy import (
    Decision,
    Verdict,
    apply_checkpoint,
    apply_fault,
    apply_sign_of_life,
)

__all__ = ["setup"]


async def setup(ctx: ServiceContext) -> None:
    bus = ctx.bus
    store = JobStore(await bus.jobs_bucket())

    async def on_fault(fault: FaultDetected) -> None:
        if fault.job is None:
            return
        decision: Decision | None = None

        def change(record: JobRecord) -> bool:
            nonlocal decision
            decision = apply_fault(record, fault)
            return decision.verdict is not Verdict.IGNORE

        result = await store.mutate(fault.job, change)
        if result is None:
            ctx.log.warning("fault for unknown job %s ignored", fault.job, extra={"job": fault.job})
            return
        before, after = result
        if decision is None or decision.verdict is Verdict.IGNORE:
            ctx.log.info("fault %s ignored: %s", fault.fault_id, decision and decision.why)
            return
        if decision.verdict is Verdict.FAIL:
            pending.pop(after.name, None)
            await fail(before, after, decision)
        else:
            pending[after.name] = after.generation
            await restart(before, after, fault, decision)

    async def restart(
        before: JobRecord, after: JobRecord, fault: FaultDetected, decision: Decision
    ) -> None:
        ctx.log.warning(
            "restarting %s: generation %d -> %d (%s)",
            after.name,
            before.generation,
            after.generation,
            fault.reason,
            extra={"job": after.name, "generation": after.generation},
        )
        await send_stops(bus, before, before.generation, f"restart after {fault.fault_id}")
        await send_assignments(bus, after)
        await bus.publish(
            bus.subjects.action(after.name),
            RecoveryStarted(
                source=bus.source,
                job=after.name,
                generation=after.generation,
                fault_id=fault.fault_id,
                level=decision.level,
                reason=fault.reason,
                from_generation=before.generation,
                to_generation=after.generation,
            ),
        )
        await announce_phase(bus, before.phase, after)

    async def fail(before: JobRecord, after: JobRecord, decision: Decision) -> None:
        ctx.log.error("job %s failed: %s", after.name, decision.why, extra={"job": after.name})
        await send_stops(bus, after, after.generation, decision.why, final=True)
        await announce_phase(bus, before.phase, after)

    # Jobs with a recovery in flight (job -> generation being started) and jobs known to
    # report progress: progress events of other jobs need no record read.
    pending: dict[str, int] = {
        r.name: r.pending_recovery.to_generation
        for r in await store.all()
        if r.pending_recovery is not None
    }
    reporting: set[str] = set()

    async def sign_of_life(event: ProcessStarted | Progress) -> None:
        if event.job is None or event.generation is None:
            return
        progress = isinstance(event, Progress)
        if progress and pending.get(event.job) != event.generation and event.job in reporting:
            return
        generation = event.generation
        result = await store.mutate(
            event.job,
            lambda r: apply_sign_of_life(r, generation, event.time, progress=progress),
        )
        if result is None:
            return
        before, after = result
        if after.reports_progress:
            reporting.add(after.name)
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
