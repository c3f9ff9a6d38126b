"""Hang detector: a rank that is alive but silent is a fault (pure logic, no I/O).

Per (job, generation, rank), from the job's ``monitoring`` settings:
- ``startupTimeoutSeconds``: the first progress report must come this soon after the
  worker started;
- ``heartbeatTimeoutSeconds``: after one, the next must come this soon.

Progress comes from ``resurge.worker`` (``progress`` events); for scripts that do not
use it, a log rule with ``expectedRecurringFrequencyInSeconds`` plays the same part
(see the log-rule detector). Times are this detector's own clock when an event arrives,
so clock skew between nodes does not matter. A stopped (SIGSTOP) worker stays alive and
silent, so it is caught the same way. Each hang is reported once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from resurge.detection import DetectorContext
from resurge.events import (
    Envelope,
    FaultScope,
    ProcessExited,
    ProcessStarted,
    Progress,
    RecoveryLevel,
)

__all__ = ["HangDetector"]

_Key = tuple[str, int, int]  # job, generation, rank


@dataclass
class _Rank:
    started: datetime
    replica: int | None
    node: str | None
    last_progress: datetime | None = None
    last_step: int | None = None
    reported: bool = False


class HangDetector:
    name = "hang"
    kinds = frozenset({"process_started", "progress", "process_exited"})

    def __init__(self) -> None:
        self._ranks: dict[_Key, _Rank] = {}

    def observe(
        self, event: ProcessStarted | Progress | ProcessExited, ctx: DetectorContext
    ) -> list[Envelope]:
        if event.job is None or event.generation is None or event.rank is None:
            return []
        key = (event.job, event.generation, event.rank)
        if isinstance(event, ProcessExited):
            self._ranks.pop(key, None)
        elif isinstance(event, ProcessStarted):
            self._ranks[key] = _Rank(started=ctx.now, replica=event.replica, node=event.node)
        else:
            rank = self._ranks.get(key)
            if rank is None:  # a start we did not see (detector restarted): count from now
                rank = self._ranks[key] = _Rank(ctx.now, event.replica, event.node)
            rank.last_progress = ctx.now
            rank.last_step = event.step
        return []

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        faults: list[Envelope] = []
        for key, rank in list(self._ranks.items()):
            job_name, generation, global_rank = key
            record = ctx.job(job_name)
            if record is None or record.phase.finished or generation < record.generation:
                del self._ranks[key]
                continue
            if rank.reported:
                continue
            monitoring = record.spec.spec.monitoring
            if rank.last_progress is None:
                limit, since, what = monitoring.startup_timeout_seconds, rank.started, "startup"
            else:
                limit, since, what = (
                    monitoring.heartbeat_timeout_seconds,
                    rank.last_progress,
                    "heartbeat",
                )
            if limit is None:
                continue
            silent = (ctx.now - since).total_seconds()
            if silent <= limit:
                continue
            rank.reported = True
            faults.append(
                ctx.fault(
                    fault_id=f"hang:{job_name}:g{generation}:r{global_rank}:{what}",
                    reason="hang",
                    scope=FaultScope.PROCESS,
                    message=(
                        f"rank {global_rank} sent no progress for {silent:.1f} s "
                        f"({what} timeout {limit:g} s)"
                    ),
                    evidence={
                        "timeout": what,
                        "limit_seconds": limit,
                        "silent_seconds": round(silent, 3),
                        "last_step": rank.last_step,
                    },
                    suggested_level=RecoveryLevel.PROCESS,
                    job=job_name,
                    generation=generation,
                    rank=global_rank,
                    replica=rank.replica,
                    node=rank.node,
                )
            )
        return faults
