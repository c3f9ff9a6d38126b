"""What ``resurge status`` shows beyond a job's record: its step and pace, its goodput,
its recent faults, alerts, recoveries and checkpoints, from the durable streams.

:func:`overview` reads one job's history (:mod:`resurge.control.history`) and returns a
:class:`JobOverview`. The step and pace come from rank 0's progress (steps per second
over the last :data:`PACE_WINDOW_SECONDS` of it); the final step from a ``total_steps``
metric the job reports with its progress (``run.progress(step, total_steps=N)``), if
it does; goodput and time lost from :func:`resurge.control.timeline.build_timeline`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resurge.control.history import FAMILIES, read_history
from resurge.control.timeline import build_timeline
from resurge.events import CheckpointSaved, FaultDetected, Progress, RecoveryFinished
from resurge.runtime.bus import Bus

__all__ = ["PACE_WINDOW_SECONDS", "JobOverview", "overview"]

PACE_WINDOW_SECONDS = 30.0
_RECENT = 5  # faults, alerts and recoveries listed


@dataclass
class JobOverview:
    """A job's step, pace, goodput and recent history (times are ISO 8601 strings)."""

    step: int | None = None
    steps_per_second: float | None = None
    final_step: int | None = None
    goodput: float | None = None
    lost_seconds: dict[str, float] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """The ``resurge status --json`` fields this adds (camelCase)."""
        return {
            "step": self.step,
            "stepsPerSecond": self.steps_per_second,
            "finalStep": self.final_step,
            "goodput": self.goodput,
            "lostSeconds": self.lost_seconds,
            "recentFaults": self.faults,
            "alerts": self.alerts,
            "recentRecoveries": self.recoveries,
            "newestCheckpoint": self.checkpoint,
        }


async def overview(bus: Bus, job: str) -> JobOverview:
    """``job``'s overview from what the streams keep of it."""
    history = await read_history(bus, job=job, families=(*FAMILIES, "cmd"))
    events = [stored.event for stored in history.events]
    found = JobOverview()
    progress = [e for e in events if isinstance(e, Progress) and e.rank == 0]
    if progress:
        last = progress[-1]
        found.step = last.step
        total = last.metrics.get("total_steps")
        found.final_step = int(total) if total is not None else None
        window = [
            e for e in progress if (last.time - e.time).total_seconds() <= PACE_WINDOW_SECONDS
        ]
        seconds = (window[-1].time - window[0].time).total_seconds()
        if seconds > 0 and window[-1].step > window[0].step:
            found.steps_per_second = round((window[-1].step - window[0].step) / seconds, 3)
    summary = build_timeline(job, events).summary
    found.goodput = summary.get("goodput")
    found.lost_seconds = summary.get("lost_seconds", {})
    for event in events:
        if isinstance(event, FaultDetected):
            entry = {
                "time": event.time.isoformat(),
                "reason": event.reason,
                "rank": event.rank,
                "node": event.node,
                "message": event.message,
                "evidence": event.evidence,
            }
            (found.alerts if event.alert_only else found.faults).append(entry)
        elif isinstance(event, RecoveryFinished):
            found.recoveries.append(
                {
                    "time": event.time.isoformat(),
                    "level": event.level.value,
                    "reason": event.reason,
                    "seconds": round(event.duration_seconds, 3),
                }
            )
        elif isinstance(event, CheckpointSaved) and event.rank == 0:
            found.checkpoint = {
                "step": event.step,
                "path": event.path,
                "time": event.time.isoformat(),
            }
    found.faults, found.alerts = found.faults[-_RECENT:], found.alerts[-_RECENT:]
    found.recoveries = found.recoveries[-_RECENT:]
    return found
