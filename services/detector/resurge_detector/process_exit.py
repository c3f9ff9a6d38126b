"""Process-exit detector: pure logic, no I/O.

- A worker that exits non-zero, or is ended by a signal, without its agent having
  stopped it, is a process-scope fault (``process_crash`` or ``process_killed``). Its
  last output lines (``ProcessExited.last_output``) go into the fault's evidence
  (``last_output``, one string, a line each) and its last line into the fault's message,
  so a failure explains itself: a traceback's error, "can't open file ...".
- When every worker of a replica has exited 0 in one generation, the replica finished.

Outputs carry ids derived from the input event's id, so a redelivered input yields
events JetStream de-duplicates.

Which workers of a replica have exited 0 is durable state (:class:`DurableState`): the
workers of a replica rarely exit together, and a detector restarted between their exits
would otherwise wait forever for exits it already consumed, and the job would never
end. The service keeps the entry ``(job, "r<replica>")`` (JSON: generation, local
ranks) in its own KV bucket, written before the raw events are acked, and gives it
back at start. Not derived from the job record: the record says which replicas
finished, not which of a replica's workers did, and the restarter and scaler own it.
An entry is deleted when its replica finishes, when its job's record says the job is
over, and when the job is deleted or submitted again (a new run: the entry names the
run's ``uid``, and one of another run is not counted); a newer generation replaces
it. Exits of a generation older than the job record's are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from resurge.detection import DetectorContext
from resurge.events import (
    Envelope,
    FaultDetected,
    FaultScope,
    ProcessExited,
    RecoveryLevel,
    ReplicaFinished,
    Source,
)

__all__ = ["ProcessExitDetector"]

_Key = tuple[str, int]  # job, replica

# The most of a worker's last output line a fault's message quotes (the evidence has all).
MESSAGE_LINE_CHARS = 300


@dataclass
class _Replica:
    """The workers of one replica that exited 0 in its newest generation seen."""

    generation: int
    succeeded: set[int] = field(default_factory=set)
    finished_by: str | None = None  # the id of the exit that completed it
    uid: str | None = None  # the job run it counts for (the record's uid), if known

    @property
    def finished(self) -> bool:
        return self.finished_by is not None


class ProcessExitDetector:
    """Crashes and success exits of workers (see the module docstring).

    ``source`` signs what it concludes when ``observe`` is given no context."""

    name = "process_exit"
    kinds = frozenset({"process_exited"})

    def __init__(self, source: Source | None = None) -> None:
        self.source = source or Source(service="detector", instance="-")
        self._replicas: dict[_Key, _Replica] = {}
        self._changed: set[_Key] = set()

    def observe(self, event: ProcessExited, ctx: DetectorContext | None = None) -> list[Envelope]:
        """A fault for a crash, a finished replica for the last of its success exits."""
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
            return [self._fault(event, ctx)]
        record = None if ctx is None else ctx.job(event.job)
        if record is not None and event.generation < record.generation:
            return []
        uid = None if record is None else record.uid
        return self._success(event, event.job, event.replica, event.generation, uid)

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        """Forget the replicas of jobs that are over."""
        for key in list(self._replicas):
            record = ctx.job(key[0])
            if record is not None and record.phase.finished:
                del self._replicas[key]
                self._changed.add(key)
        return []

    def forget_job(self, job: str) -> None:
        """A new run of ``job`` (:class:`~resurge.detection.ForgetsJobs`): its replicas'
        success exits are counted again from its generation 0; the stored entries go."""
        for key in [k for k in self._replicas if k[0] == job]:
            del self._replicas[key]
            self._changed.add(key)

    # -- durable state ------------------------------------------------------------------

    def state_changes(self) -> Mapping[tuple[str, str], bytes | None]:
        """The replicas whose success exits changed since the last call."""
        changes: dict[tuple[str, str], bytes | None] = {}
        for job, replica in self._changed:
            state = self._replicas.get((job, replica))
            value = None
            if state is not None and not state.finished:
                body = {
                    "generation": state.generation,
                    "succeeded": sorted(state.succeeded),
                    "uid": state.uid,
                }
                value = json.dumps(body).encode()
            changes[(job, f"r{replica}")] = value
        self._changed.clear()
        return changes

    def restore_state(self, job: str, key: str, value: bytes) -> None:
        """One replica's success exits, given back at start."""
        body = json.loads(value)
        replica = int(key.removeprefix("r"))
        known = self._replicas.get((job, replica))
        if known is None or known.generation <= body["generation"]:
            self._replicas[(job, replica)] = _Replica(
                generation=int(body["generation"]),
                succeeded={int(r) for r in body["succeeded"]},
                uid=body.get("uid"),
            )

    # -- conclusions --------------------------------------------------------------------

    def _success(
        self, event: ProcessExited, job: str, replica: int, generation: int, uid: str | None
    ) -> list[Envelope]:
        state = self._replicas.get((job, replica))
        if state is not None and uid is not None and state.uid not in (None, uid):
            state = None  # an earlier run's count (the job was deleted and submitted again)
        if state is not None and generation < state.generation:
            return []
        if state is None or generation > state.generation:
            state = self._replicas[(job, replica)] = _Replica(generation, uid=uid)
        if state.finished_by == event.id:  # redelivered, its conclusion maybe unpublished
            return [self._finished(event, job, replica, generation)]
        if state.finished or event.local_rank in state.succeeded:
            return []
        state.succeeded.add(event.local_rank)
        self._changed.add((job, replica))
        if len(state.succeeded) < event.local_world_size:
            return []
        state.finished_by = event.id
        return [self._finished(event, job, replica, generation)]

    def _finished(
        self, event: ProcessExited, job: str, replica: int, generation: int
    ) -> ReplicaFinished:
        return ReplicaFinished(
            id=f"finished-{event.id}",
            source=self.source,
            job=job,
            replica=replica,
            node=event.node,
            generation=generation,
        )

    def _fault(self, event: ProcessExited, ctx: DetectorContext | None) -> FaultDetected:
        if ctx is None:
            ctx = DetectorContext(now=datetime.now(UTC), source=self.source)
        killed = event.signal is not None
        how = f"signal {event.signal}" if killed else f"exit code {event.exit_code}"
        said = [line.rstrip() for line in event.last_output if line.strip()]
        last = f"; its last output: {_shortened(said[-1])}" if said else ""
        evidence: dict[str, str | int | float | bool | None] = {
            "pid": event.pid,
            "exit_code": event.exit_code,
            "signal": event.signal,
            "local_rank": event.local_rank,
            "exited_at": event.time.isoformat(),
        }
        if said:
            evidence["last_output"] = "\n".join(said)
        return ctx.fault(
            event,
            id=f"fault-{event.id}",
            fault_id=f"process_exit:{event.job}:g{event.generation}:r{event.rank}",
            scope=FaultScope.PROCESS,
            reason="process_killed" if killed else "process_crash",
            message=f"rank {event.rank} (pid {event.pid}) on {event.node} ended with {how}{last}",
            evidence=evidence,
            suggested_level=RecoveryLevel.PROCESS,
        )


def _shortened(line: str) -> str:
    """One output line as a message quotes it: its end kept if it is long."""
    line = line.strip()
    return line if len(line) <= MESSAGE_LINE_CHARS else "..." + line[-MESSAGE_LINE_CHARS:]
