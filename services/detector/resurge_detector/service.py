"""The detector service: consume raw process exits, publish faults and finished replicas."""

from __future__ import annotations

from resurge.events import Envelope, FaultDetected, ProcessExited, ReplicaFinished
from resurge.service import ServiceContext
from resurge_detector.process_exit import ProcessExitDetector

__all__ = ["setup"]


async def setup(ctx: ServiceContext) -> None:
    bus = ctx.bus
    detector = ProcessExitDetector(bus.source)

    async def publish(event: Envelope) -> None:
        assert event.job is not None
        if isinstance(event, FaultDetected):
            ctx.log.warning(
                "fault %s: %s",
                event.fault_id,
                event.message,
                extra={"job": event.job, "rank": event.rank, "generation": event.generation},
            )
            await bus.publish(bus.subjects.fault(event.job, event.scope.value), event)
        elif isinstance(event, ReplicaFinished):
            await bus.publish(bus.subjects.job(event.job), event)

    async def on_exit(event: ProcessExited) -> None:
        for out in detector.observe(event):
            await publish(out)

    await bus.consume(
        bus.subjects.raw(None, "process_exited", None),
        "detector-process-exit",
        on_exit,
        expects=(ProcessExited,),
    )
