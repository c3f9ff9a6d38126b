"""Process-exit detector: pure logic, no I/O.

- A worker that exits non-zero, or is ended by a signal, without its agent having
  stopped it, is a process-scope fault (``process_crash`` or ``process_killed``).
- When every worker of a replica has exited 0 in one generation, the replica finished.

Outputs carry ids derived from the input event's id, so a redelivered input yields
events JetStream de-duplicates.
"""

from __future__ import annotations

from resurge.detection import DetectorContext
from resurge.events import (
    Envelope,
    FaultDetected,
    FaultScope,
    ProcessExited,
    RecoveryLevel,
    ReplicaFinished,
    Severity,
    Source,
)

__all__ = ["ProcessExitDetector"]

_Key = tuple[str, int, int]  # job, replica, generation


class ProcessExitDetector:
    name = "process_exit"
    kinds = frozenset({"process_exited"})

    def __init__(self, source: Source | None = None) -> None:
        self.source = source or Source(service="detector", instance="-")
        self._succeeded: dict[_Key, set[int]] = {}
        self._newest: dict[tuple[str, int], int] = {}

    def observe(self, event: ProcessExited, ctx: DetectorContext | None = None) -> list[Envelope]:
        if ctx is not None:
            self.source = ctx.source
        if (
            not isinstance(event, ProcessExited)
            or event.job is None
            or event.replica is None
            or event.generation is None
        ):
            return []
        if event.expected:
            return []
        if not event.succeeded:
            return [self._fault(event)]
        return self._success(event, event.job, event.replica, event.generation)

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        return []

    def _success(
        self, event: ProcessExited, job: str, replica: int, generation: int
    ) -> list[Envelope]:
        newest = self._newest.get((job, replica), -1)
        if generation < newest:
            return []
        if generation > newest:
            self._newest[(job, replica)] = generation
            self._succeeded.pop((job, replica, newest), None)
        done = self._succeeded.setdefault((job, replica, generation), set())
        if event.local_rank in done:
            return []
        done.add(event.local_rank)
        if len(done) < event.local_world_size:
            return []
        return [
            ReplicaFinished(
                id=f"finished-{event.id}",
                source=self.source,
                job=job,
                replica=replica,
                node=event.node,
                generation=generation,
            )
        ]

    def _fault(self, event: ProcessExited) -> FaultDetected:
        killed = event.signal is not None
        how = f"signal {event.signal}" if killed else f"exit code {event.exit_code}"
        return FaultDetected(
            id=f"fault-{event.id}",
            source=self.source,
            job=event.job,
            replica=event.replica,
            node=event.node,
            rank=event.rank,
            generation=event.generation,
            fault_id=f"process_exit:{event.job}:g{event.generation}:r{event.rank}",
            scope=FaultScope.PROCESS,
            reason="process_killed" if killed else "process_crash",
            severity=Severity.ERROR,
            message=f"rank {event.rank} (pid {event.pid}) on {event.node} ended with {how}",
            evidence={
                "pid": event.pid,
                "exit_code": event.exit_code,
                "signal": event.signal,
                "local_rank": event.local_rank,
                "exited_at": event.time.isoformat(),
            },
            suggested_level=RecoveryLevel.PROCESS,
        )
