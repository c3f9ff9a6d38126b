"""The scaler service: job submitted -> record and Assign(0); all replicas done -> Succeeded."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import Field

from resurge.bus import TransientError
from resurge.events import (
    JobDeleted,
    JobPhase,
    JobSubmitted,
    ReplicaFinished,
)
from resurge.job_commands import announce_phase, send_assignments, send_stops
from resurge.records import JobStore
from resurge.service import ServiceContext
from resurge.settings import Settings
from resurge_scaler.admission import admit, mark_replica_finished

__all__ = ["ScalerSettings", "make_setup"]


class ScalerSettings(Settings):
    nodes: str = Field(
        default="local", description="Comma-separated node names replicas are placed on."
    )

    @property
    def node_list(self) -> list[str]:
        return [n.strip() for n in self.nodes.split(",") if n.strip()] or ["local"]


def make_setup(settings: ScalerSettings) -> Callable[[ServiceContext], Awaitable[None]]:
    async def setup(ctx: ServiceContext) -> None:
        bus = ctx.bus
        store = JobStore(await bus.jobs_bucket())

        async def on_submitted(event: JobSubmitted) -> None:
            job = event.spec
            found = await store.get(job.name)
            if found is not None and not found[0].phase.finished:
                record = found[0]  # a redelivery: repeat the assignments, agents ignore repeats
            else:
                record = admit(job, settings.node_list, found[0] if found else None)
                written = (
                    await store.create(record)
                    if found is None
                    else await store.replace(record, found[1])
                )
                if not written:
                    raise TransientError(f"job record {job.name} changed while admitting it")
                ctx.log.info("admitted %s", job.name, extra={"job": job.name})
                await announce_phase(bus, JobPhase.PENDING, record)
            await send_assignments(bus, record)

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
            await store.kv.delete(store.key(event.job))

        async def on_job_event(event: JobSubmitted | ReplicaFinished | JobDeleted) -> None:
            if isinstance(event, JobSubmitted):
                await on_submitted(event)
            elif isinstance(event, ReplicaFinished):
                await on_finished(event)
            else:
                await on_deleted(event)

        await bus.consume(
            bus.subjects.all("job"),
            "scaler",
            on_job_event,
            expects=(JobSubmitted, ReplicaFinished, JobDeleted),
        )

    return setup
