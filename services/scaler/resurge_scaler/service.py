"""The scaler service: admits jobs onto nodes, starts them, ends them.

- job submitted -> Pending record; then every Pending job that fits is placed, its
  worker groups are created through the cluster backend, and generation g is assigned.
- capacity changed, job finished or deleted -> try the Pending jobs again.
- every replica finished -> Succeeded; a finished job's worker groups are deleted.
"""

from __future__ import annotations

import asyncio
from functools import partial

from resurge.cluster.local import LocalBackend
from resurge.control.job_messages import announce_phase, send_assignments, send_stops
from resurge.control.records import JobRecord, JobStore
from resurge.control.worker_groups import worker_groups
from resurge.events import (
    CapacityChanged,
    JobDeleted,
    JobPhase,
    JobSubmitted,
    PhaseChanged,
    RecoveryFinished,
    RecoveryStarted,
    ReplicaFinished,
)
from resurge.runtime.bus import TransientError
from resurge.runtime.service import ServiceContext
from resurge_scaler.admission import (
    admission_order,
    mark_replica_finished,
    new_record,
    place,
    start,
    update_live,
    wait_reason,
    why_waiting,
)

__all__ = ["setup"]


async def setup(ctx: ServiceContext) -> None:
    bus = ctx.bus
    store = JobStore(await bus.jobs_bucket())
    backend = await LocalBackend.open(bus)
    admitting = asyncio.Lock()

    async def admit_pending() -> None:
        async with admitting:
            pending = admission_order(await store.all())
            if not pending:
                return
            nodes = await backend.live_nodes()
            used: dict[str, int] = {}
            for group in await backend.list_worker_groups():
                used[group.node] = used.get(group.node, 0) + group.nproc
            for held in await store.all():
                if not held.phase.finished:
                    for node in held.spare_nodes:
                        used[node] = used.get(node, 0) + held.spec.spec.nproc_per_node
            for record in pending:
                snapshot = dict(used)
                fit = place(record.spec, nodes, used, record.avoid_nodes)
                if fit is None:
                    why = why_waiting(record.spec, nodes, snapshot, record.avoid_nodes)
                    await store.mutate(record.name, partial(wait_reason, reason=why))
                    continue
                placements, spares = fit
                result = await store.mutate(
                    record.name, partial(start, placements=placements, spares=spares)
                )
                if result is None or result[0] is result[1]:
                    continue
                before, after = result
                for group in worker_groups(after):
                    await backend.create_worker_group(group)
                await send_assignments(bus, after)
                ctx.log.info("started %s: %s", after.name, after.message, extra={"job": after.name})
                await announce_phase(bus, before.phase, after)

    async def release(record: JobRecord) -> None:
        for p in record.placements:
            await backend.delete_worker_group(record.name, p.replica, p.node)

    async def on_submitted(event: JobSubmitted) -> None:
        job = event.spec
        found = await store.get(job.name)
        if found is not None and not found[0].phase.finished:
            await store.mutate(job.name, partial(update_live, job=job))
            ctx.log.info("%s is already %s: monitoring settings updated, the rest kept",
                         job.name, found[0].phase.value)  # fmt: skip
            return
        record = new_record(job, found[0] if found else None)
        written = (
            await store.create(record) if found is None else await store.replace(record, found[1])
        )
        if not written:
            raise TransientError(f"job record {job.name} changed while admitting it")
        await announce_phase(bus, None, record)
        await admit_pending()

    async def on_finished(event: ReplicaFinished) -> None:
        if event.job is None or event.replica is None or event.generation is None:
            return
        replica, generation = event.replica, event.generation
        result = await store.mutate(
            event.job, lambda r: mark_replica_finished(r, replica, generation)
        )
        if result is None or result[0] is result[1]:
            return
        before, after = result
        if after.phase is JobPhase.SUCCEEDED:
            ctx.log.info("job %s succeeded", after.name, extra={"job": after.name})
            await announce_phase(bus, before.phase, after)
            await send_stops(bus, after, after.generation, "job succeeded", final=True)

    async def on_deleted(event: JobDeleted) -> None:
        if event.job is None:
            return
        found = await store.get(event.job)
        if found is None:
            return
        await send_stops(bus, found[0], found[0].generation, "job deleted", final=True)
        await release(found[0])
        await store.kv.delete(store.key(event.job))
        await admit_pending()

    async def on_job_event(event: JobSubmitted | ReplicaFinished | JobDeleted) -> None:
        if isinstance(event, JobSubmitted):
            await on_submitted(event)
        elif isinstance(event, ReplicaFinished):
            await on_finished(event)
        else:
            await on_deleted(event)

    async def on_action(event: PhaseChanged | RecoveryStarted | RecoveryFinished) -> None:
        if not isinstance(event, PhaseChanged) or event.job is None:
            return
        if event.phase is JobPhase.PENDING and event.previous is not None:
            await admit_pending()  # requeued by the restarter: no node to move a replica to
            return
        if not event.phase.finished:
            return
        found = await store.get(event.job)
        if found is not None and found[0].phase.finished:
            await release(found[0])
            await admit_pending()

    async def on_capacity(event: CapacityChanged) -> None:
        await admit_pending()

    await bus.consume(
        bus.subjects.all("job"),
        "scaler",
        on_job_event,
        expects=(JobSubmitted, ReplicaFinished, JobDeleted),
    )
    await bus.consume(
        bus.subjects.action(None),
        "scaler-phases",
        on_action,
        expects=(PhaseChanged, RecoveryStarted, RecoveryFinished),
    )
    await bus.consume(
        bus.subjects.all("capacity"), "scaler-capacity", on_capacity, expects=(CapacityChanged,)
    )
