"""The runs of a job name, read back from its ``job`` subject.

A job deleted and submitted again under its name is a new run. A run is named by its
uid: the id of the JobSubmitted event that started it, which the scaler gives the job
record it creates (``JobRecord.uid``; ``resurge status JOB --json`` shows it). A run
starts with a JobSubmitted while the name is free (the first one, or the first after a
JobDeleted; also the one whose id is the uid asked for: a finished job submitted again
without a delete) and ends with the next JobDeleted; a JobSubmitted while it runs only
changes its monitoring settings.

:func:`run_events` keeps, of a job's history, what belongs to one run: the events from
its submission up to its deletion, less commands addressed to another run and, where
the run's Assigns were read, agents' reports of a generation the run never assigned
(the deleted run's workers, still stopping when the job was submitted again). Pure, no
I/O but :func:`job_runs`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from resurge.control.views.history import read_history
from resurge.events import (
    AgentStateChanged,
    Assign,
    CheckpointSaved,
    Event,
    JobDeleted,
    JobSubmitted,
    LogLine,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    Progress,
    RendezvousPassed,
    WorkerFault,
)
from resurge.events.commands import RunCommand
from resurge.runtime.bus import Bus

__all__ = ["Run", "job_runs", "run_events", "runs_of"]

# What agents report about the workers of one generation.
_AGENT_REPORTS = (
    AgentStateChanged,
    CheckpointSaved,
    LogLine,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    Progress,
    RendezvousPassed,
    WorkerFault,
)


@dataclass(frozen=True)
class Run:
    """One run of a job: its uid, when it was submitted, and when deleted (if it was)."""

    uid: str
    submitted: datetime
    deleted: datetime | None = None

    def holds(self, event: Event) -> bool:
        """Whether ``event`` belongs to this run (by its time, and a command by its uid)."""
        if event.time < self.submitted:
            return False
        if self.deleted is not None and event.time > self.deleted:
            return False
        return not (isinstance(event, RunCommand) and event.uid not in (None, self.uid))


def runs_of(events: Iterable[Event], uid: str | None = None) -> list[Run]:
    """The runs the job events (time order) show, oldest first; a JobSubmitted whose id
    is ``uid`` starts a run even where the name was not free."""
    runs: list[Run] = []
    live = False
    for event in events:
        if isinstance(event, JobSubmitted) and (not live or event.id == uid):
            if live:
                runs[-1] = Run(runs[-1].uid, runs[-1].submitted, event.time)
            runs.append(Run(event.id, event.time))
            live = True
        elif isinstance(event, JobDeleted) and live:
            runs[-1] = Run(runs[-1].uid, runs[-1].submitted, event.time)
            live = False
    return runs


def run_events(events: Iterable[Event], run: Run) -> list[Event]:
    """The events of ``run`` among a job's ``events``."""
    held = [event for event in events if run.holds(event)]
    assigned = {event.generation for event in held if isinstance(event, Assign)}
    if not assigned:  # no command read: by time alone
        return held
    return [
        event
        for event in held
        if not isinstance(event, _AGENT_REPORTS)
        or event.generation is None
        or event.generation in assigned
    ]


async def job_runs(bus: Bus, job: str, uid: str | None = None) -> list[Run]:
    """The runs of ``job`` the ``job`` stream still holds (a day by default)."""
    history = await read_history(bus, job=job, families=("job",))
    return runs_of((stored.event for stored in history.events), uid)
