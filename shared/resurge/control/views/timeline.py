"""A job's timeline and goodput, worked out from its stored events. Pure, no I/O.

:func:`build_timeline` takes a job's events in time order (``resurge.control.views.history``)
and returns what the report draws and tabulates:

- ``steps``: (seconds since start, step) of rank 0's progress;
- ``world``: (seconds, world size) at each generation's assignment, and 0 from the
  moment the cluster went down (the job's last event before the local cluster started
  again) to the next assignment;
- ``faults``, ``recoveries``, ``resizes``, ``phases``: the marks, in seconds since start;
- ``summary``: wall time, productive time and time lost by cause.

Time lost, by cause (each counted once, in seconds):

- ``detection``: from a worker's unexpected exit to the fault that names it;
- ``restart``: each recovery's duration (the fault's detection to the new generation's
  training: its first step, or for a script that reports none its ranks passing their
  rendezvous); a recovery that never ended so (its generation faulted first, or the job
  failed) until the next recovery began or the timeline ends; the job's time before its
  first fault if it had not trained by then (a job that never trained has goodput 0); and
  each resize's pause (the last step at the old size to the first at the new);
- ``redone_steps``: steps trained again after a restart resumed from an older
  checkpoint, at the job's median step time;
- ``waiting_for_capacity``: time in ``Pending`` after the job first ran, but for
  the time the cluster was down; for a job that never ran, all of its time (so its
  goodput is 0, not 100%);
- ``cluster_down``: from the job's last event before the local cluster started again
  (``resurge down`` or a crash of the machine, then ``resurge up``: the restart's
  PhaseChanged says :data:`CLUSTER_RESTARTED`) to the job's next phase after Pending.

Goodput is productive time (wall time less those) over wall time.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from resurge.events import (
    Assign,
    Event,
    FaultDetected,
    JobPhase,
    PhaseChanged,
    ProcessExited,
    Progress,
    RecoveryFinished,
    RecoveryStarted,
    RendezvousPassed,
    ScaleDecided,
)

__all__ = ["CLUSTER_RESTARTED", "Timeline", "build_timeline"]

CLUSTER_RESTARTED = "the local cluster started again"
"""How the PhaseChanged of a job requeued by a local cluster's start begins."""


@dataclass
class Timeline:
    """What a report shows of one job (times in seconds since ``start``)."""

    job: str
    start: str = ""
    end: str = ""
    phase: str = ""
    steps: list[tuple[float, int]] = field(default_factory=list)
    world: list[tuple[float, int]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    resizes: list[dict[str, Any]] = field(default_factory=list)
    phases: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Everything, as JSON-ready data."""
        return asdict(self)


def build_timeline(job: str, events: list[Event]) -> Timeline:
    """The timeline of ``job`` from its events (time order); empty if there are none."""
    mine = [e for e in events if e.job == job]
    timeline = Timeline(job=job)
    if not mine:
        return timeline
    t0 = mine[0].time

    def at(when: datetime) -> float:
        return round((when - t0).total_seconds(), 3)

    timeline.start, timeline.end = t0.isoformat(), mine[-1].time.isoformat()
    previous: Event | None = None
    for event in mine:
        _mark(timeline, event, at)
        if _cluster_restarted(event) and previous is not None:
            _went_down(timeline, at(previous.time))
        previous = event
    timeline.summary = _summary(timeline, mine, at)
    return timeline


def _cluster_restarted(event: Event) -> bool:
    return (
        isinstance(event, PhaseChanged)
        and event.phase is JobPhase.PENDING
        and event.message.startswith(CLUSTER_RESTARTED)
    )


def _went_down(timeline: Timeline, since: float) -> None:
    """The cluster was down from ``since`` to the restart just marked (the last phase)."""
    timeline.phases[-1]["cluster_down_since"] = since
    if timeline.world and timeline.world[-1][1] != 0:
        timeline.world.append((since, 0))


def _mark(timeline: Timeline, event: Event, at: Any) -> None:
    when = at(event.time)
    if isinstance(event, Progress) and event.rank == 0:
        timeline.steps.append((when, event.step))
    elif isinstance(event, Assign) and event.replica in (0, None):
        if not timeline.world or timeline.world[-1][1] != event.world_size:
            timeline.world.append((when, event.world_size))
    elif isinstance(event, FaultDetected):
        timeline.faults.append(
            {
                "time": when,
                "reason": event.reason,
                "scope": event.scope.value,
                "rank": event.rank,
                "node": event.node,
                "alert": event.alert_only,
                "message": event.message,
            }
        )
    elif isinstance(event, RecoveryStarted):
        timeline.recoveries.append(
            {"time": when, "level": event.level.value, "reason": event.reason, "seconds": None}
        )
    elif isinstance(event, RecoveryFinished):
        started = [r for r in timeline.recoveries if r["seconds"] is None]
        if started:
            started[-1]["seconds"] = round(event.duration_seconds, 3)
        else:
            timeline.recoveries.append(
                {
                    "time": round(when - event.duration_seconds, 3),
                    "level": event.level.value,
                    "reason": event.reason,
                    "seconds": round(event.duration_seconds, 3),
                }
            )
    elif isinstance(event, ScaleDecided):
        timeline.resizes.append(
            {
                "time": when,
                "resize": event.resize,
                "from": event.from_replicas,
                "to": event.to_replicas,
                "why": event.why,
            }
        )
    elif isinstance(event, PhaseChanged):
        timeline.phases.append({"time": when, "phase": event.phase.value})
        timeline.phase = event.phase.value


def _summary(timeline: Timeline, events: list[Event], at: Any) -> dict[str, Any]:
    wall = at(events[-1].time)
    lost = {
        "detection": _detection(events),
        "restart": _recovering(timeline, events, at, wall) + _resize_pauses(timeline),
        "redone_steps": _redone(timeline),
        "waiting_for_capacity": _waiting(timeline, wall),
        "cluster_down": _cluster_down(timeline, wall),
    }
    lost = {cause: round(seconds, 3) for cause, seconds in lost.items()}
    productive = max(wall - sum(lost.values()), 0.0)
    return {
        "wall_seconds": round(wall, 3),
        "productive_seconds": round(productive, 3),
        "goodput": round(productive / wall, 4) if wall > 0 else None,
        "lost_seconds": lost,
        "faults": sum(1 for f in timeline.faults if not f["alert"]),
        "alerts": sum(1 for f in timeline.faults if f["alert"]),
        "recoveries_by_level": dict(Counter(r["level"] for r in timeline.recoveries)),
        "resizes": len(timeline.resizes),
        "final_step": max((s for _, s in timeline.steps), default=0),
        "phase": timeline.phase,
    }


def _detection(events: list[Event]) -> float:
    """Seconds from each unexpected exit to the first fault after it naming its rank."""
    total = 0.0
    exits: dict[int | None, datetime] = {}
    for event in events:
        if isinstance(event, ProcessExited) and not event.expected and event.exit_code != 0:
            exits.setdefault(event.rank, event.time)
        elif isinstance(event, FaultDetected) and event.rank in exits:
            total += max((event.time - exits.pop(event.rank)).total_seconds(), 0.0)
    return total


def _recovering(timeline: Timeline, events: list[Event], at: Any, wall: float) -> float:
    """Time the job did not train for a fault: each recovery until it ended (its new
    generation trained), one that never ended until the next began (or the end), and
    the time before the first recovery if the job had not trained by then."""
    recoveries = sorted(timeline.recoveries, key=lambda r: r["time"])
    total = 0.0
    for index, recovery in enumerate(recoveries):
        if recovery["seconds"] is not None:
            total += recovery["seconds"]
            continue
        until = recoveries[index + 1]["time"] if index + 1 < len(recoveries) else wall
        total += max(until - recovery["time"], 0.0)
    if recoveries:
        first = recoveries[0]["time"]
        trained = [
            e
            for e in events
            if isinstance(e, (Progress, RendezvousPassed, RecoveryFinished)) and at(e.time) < first
        ]
        if not trained:
            total += max(first, 0.0)
    return total


def _step_seconds(timeline: Timeline) -> float:
    gaps = [
        (t1 - t0) / (s1 - s0)
        for (t0, s0), (t1, s1) in zip(timeline.steps, timeline.steps[1:], strict=False)
        if s1 > s0
    ]
    return statistics.median(gaps) if gaps else 0.0


def _redone(timeline: Timeline) -> float:
    """Steps reported again (a step at or below the highest one seen before it)."""
    redone, highest = 0, 0
    for _, step in timeline.steps:
        if step <= highest:
            redone += 1
        highest = max(highest, step)
    return redone * _step_seconds(timeline)


def _resize_pauses(timeline: Timeline) -> float:
    """For each resize whose new size was assigned before the next resize: the gap
    between the steps either side of that assignment (the last step at the old size to
    the first at the new)."""
    total = 0.0
    resizes = timeline.resizes
    for index, resize in enumerate(resizes):
        until = resizes[index + 1]["time"] if index + 1 < len(resizes) else float("inf")
        changes = [t for t, _ in timeline.world if resize["time"] <= t < until]
        if not changes:
            continue  # dropped, or not carried out yet
        before = [t for t, _ in timeline.steps if t <= changes[0]]
        after = [t for t, _ in timeline.steps if t > changes[0]]
        if before and after:
            total += after[0] - before[-1]
    return total


def _waiting(timeline: Timeline, wall: float) -> float:
    """Time in Pending after the job first ran, up to the cluster going down."""
    total, pending_since, ran = 0.0, None, False
    for mark in timeline.phases:
        if mark["phase"] == JobPhase.RUNNING.value:
            ran = True
        down_since = mark.get("cluster_down_since")
        if pending_since is not None:
            until = mark["time"] if down_since is None else down_since
            total += max(until - pending_since, 0.0)
            pending_since = None
        if ran and mark["phase"] == JobPhase.PENDING.value and down_since is None:
            pending_since = mark["time"]
    if pending_since is not None:
        total += wall - pending_since
    if not ran:  # it never ran: all its time so far went waiting for capacity
        return wall
    return total


def _cluster_down(timeline: Timeline, wall: float) -> float:
    """From each time the cluster went down to the job's next phase after Pending."""
    total, down_since = 0.0, None
    for mark in timeline.phases:
        if down_since is not None and mark["phase"] != JobPhase.PENDING.value:
            total += max(mark["time"] - down_since, 0.0)
            down_since = None
        if down_since is None and mark.get("cluster_down_since") is not None:
            down_since = mark["cluster_down_since"]
    if down_since is not None:
        total += max(wall - down_since, 0.0)
    return total
