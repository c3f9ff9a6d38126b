"""What ``resurge status`` shows beyond a job's record: its step and pace, its goodput,
its recent faults, alerts, recoveries and checkpoints, from the durable streams.

:func:`overview` reads one job's history (:mod:`resurge.control.views.history`) and returns a
:class:`JobOverview`. The step and pace come from rank 0's progress (steps per second
over the last :data:`PACE_WINDOW_SECONDS` of it); the final step from a ``total_steps``
metric the job reports with its progress (``run.progress(step, total_steps=N)``), if
it does; goodput and time lost from :func:`resurge.control.views.timeline.build_timeline`.
Given a :class:`~resurge.control.views.runs.Run`, only that run's events count (a job deleted
and submitted again under its name is a new run); :func:`past_run_view` is the status
object of a run whose record is gone, from its events alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resurge.control.views.history import FAMILIES, read_history
from resurge.control.views.runs import Run, run_events
from resurge.control.views.timeline import build_timeline
from resurge.events import (
    CheckpointSaved,
    Event,
    FaultDetected,
    PhaseChanged,
    Progress,
    RecoveryFinished,
    RecoveryStarted,
)
from resurge.runtime.bus import Bus

__all__ = [
    "PACE_WINDOW_SECONDS",
    "JobOverview",
    "overview",
    "past_run_view",
    "run_history",
    "summarize",
]

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


async def run_history(bus: Bus, job: str, run: Run | None) -> list[Event]:
    """``job``'s stored events (of ``run`` only, if given), oldest first."""
    since = None if run is None else run.submitted
    history = await read_history(bus, job=job, families=(*FAMILIES, "cmd"), since=since)
    events = [stored.event for stored in history.events]
    return events if run is None else run_events(events, run)


async def overview(bus: Bus, job: str, run: Run | None = None) -> JobOverview:
    """``job``'s overview (of ``run`` only, if given) from what the streams keep of it."""
    return summarize(job, await run_history(bus, job, run))


def past_run_view(job: str, run: Run, events: list[Event]) -> dict[str, Any]:
    """The status object of ``run`` of ``job`` from its ``events`` (its record is gone):
    its last phase, generation, restarts by level (recoveries started) and last fault,
    and its overview."""
    phases = [e for e in events if isinstance(e, PhaseChanged)]
    faults = [e for e in events if isinstance(e, FaultDetected) and not e.alert_only]
    restarts: dict[str, int] = {}
    for event in events:
        if isinstance(event, RecoveryStarted):
            restarts[event.level.value] = restarts.get(event.level.value, 0) + 1
    generations = [e.generation for e in events if e.generation is not None]
    last = faults[-1] if faults else None
    view: dict[str, Any] = {
        "name": job,
        "uid": run.uid,
        "submitted": run.submitted.isoformat(),
        "deleted": None if run.deleted is None else run.deleted.isoformat(),
        "phase": phases[-1].phase.value if phases else "Pending",
        "message": phases[-1].message if phases else "",
        "generation": max(generations, default=0),
        "restarts": restarts,
        "lastFault": None
        if last is None
        else {"reason": last.reason, "scope": last.scope.value, "time": last.time.isoformat()},
    }
    return view | summarize(job, events).as_json()


def summarize(job: str, events: list[Event]) -> JobOverview:
    """The overview of ``job`` from its ``events`` (oldest first)."""
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
