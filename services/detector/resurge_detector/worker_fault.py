"""Worker-fault detector: pure logic, no I/O.

A ``worker_fault`` raw event (a worker under ``resurge.worker.restartable`` caught an
exception in its training function and waits to be restarted in-process) is a
process-scope fault: reason ``worker_exception``, severity error, suggested level
``in_process``. Its evidence names the exception (``exception``, ``message``),
``local_rank``, the end of the traceback (``traceback_tail``) and when the agent
received the report (``reported_at``, ISO 8601).

One fault per rank and generation (``fault_id`` ``worker_fault:<job>:g<g>:r<rank>``);
the output's id is derived from the input event's id, so a redelivered input yields an
event JetStream de-duplicates.
"""

from __future__ import annotations

from datetime import UTC, datetime

from resurge.detection import DetectorContext
from resurge.events import Envelope, FaultScope, RecoveryLevel, Source, WorkerFault

__all__ = ["WorkerFaultDetector"]

TRACEBACK_TAIL_CHARS = 1024


class WorkerFaultDetector:
    """A worker's caught exception is an in-process fault (see the module docstring).

    ``source`` signs what it concludes when ``observe`` is given no context.
    """

    name = "worker_fault"
    kinds = frozenset({"worker_fault"})

    def __init__(self, source: Source | None = None) -> None:
        self.source = source or Source(service="detector", instance="-")

    def observe(self, event: WorkerFault, ctx: DetectorContext | None = None) -> list[Envelope]:
        """The fault of one ``worker_fault`` event; none for an event of no job."""
        if ctx is None:
            ctx = DetectorContext(now=datetime.now(UTC), source=self.source)
        self.source = ctx.source
        if not isinstance(event, WorkerFault) or event.job is None or event.generation is None:
            return []
        short = event.exception.rsplit(".", 1)[-1]
        detail = f"{short}: {event.message}" if event.message else short
        fault = ctx.fault(
            event,
            id=f"fault-{event.id}",
            fault_id=f"worker_fault:{event.job}:g{event.generation}:r{event.rank}",
            scope=FaultScope.PROCESS,
            reason="worker_exception",
            message=f"rank {event.rank} on {event.node} raised {detail[:300]}",
            evidence={
                "exception": event.exception,
                "message": event.message,
                "local_rank": event.local_rank,
                "traceback_tail": event.traceback[-TRACEBACK_TAIL_CHARS:],
                "reported_at": event.time.isoformat(),
            },
            suggested_level=RecoveryLevel.IN_PROCESS,
        )
        return [fault]

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        """Nothing to judge over time."""
        return []
