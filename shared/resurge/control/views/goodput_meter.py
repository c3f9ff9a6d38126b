"""Each job's goodput as it happens: running sums of the time lost, by cause. Pure, no I/O.

:class:`GoodputMeter` is fed what a service sees live (faults, finished recoveries and
resizes, rank 0's steps, phase changes) and keeps, per job, the seconds lost by cause,
in the words of :mod:`resurge.control.views.timeline` (which works the same causes out from
stored events for ``resurge report``), so the two agree:

- ``detection``: from a worker's unexpected exit (the fault's ``exited_at`` evidence)
  to the fault that names it; each fault counted once;
- ``restart``: each recovery's duration (the fault's detection to the new generation's
  training: its first step, or its ranks passing their rendezvous); a recovery that
  never ended so (its generation faulted first, or the job failed) until the next
  recovery began, or up to now while it is open; the time from submission to the first
  fault if the job had not trained by then (a job that never trained has goodput 0; a
  step from before that fault that arrives after it takes that time back);
  and each resize's pause (the resize decided to the new size's training);
- ``redone_steps``: steps trained again after a restart resumed from an older
  checkpoint (a rank-0 step at or below the highest one seen before it), at the job's
  median step time (over its recent steps);
- ``waiting_for_capacity``: time in ``Pending`` after the job first ran; for a job
  that never ran, all of its time (its goodput is 0, not 100%);
- ``cluster_down``: the time a local cluster was down (``resurge down`` then ``up``).
  The timeline works it out from the stored events; this meter lives in the restarter,
  which stops with the cluster and starts afresh, so it reports 0 for it.

Goodput is productive time (wall time less those) over wall time; wall time runs from
the job's submission to now, or to the moment it finished.

Memory is bounded: a job is forgotten when it is deleted, and at most
``keep_finished`` finished jobs are kept (the longest finished first out).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime

from resurge.contract.vocabulary import JobPhase

__all__ = ["CAUSES", "GoodputMeter", "JobGoodput"]

CAUSES = ("detection", "restart", "redone_steps", "waiting_for_capacity", "cluster_down")
"""The causes of lost time, as :mod:`resurge.control.views.timeline` names them."""

# Rank-0 step gaps a job's median step time is taken over.
_GAPS_KEPT = 64
# Fault ids remembered per job, so a redelivered fault is not counted twice.
_FAULTS_KEPT = 64


@dataclass
class JobGoodput:
    """One job's running sums (seconds) and what they are worked out from."""

    submitted: datetime
    finished_at: datetime | None = None
    detection: float = 0.0
    restart: float = 0.0
    waiting: float = 0.0
    redone: int = 0
    ran: bool = False
    trained: bool = False
    recovering_since: datetime | None = None
    recovered_before: bool = False
    # The first fault's detection and the seconds before it counted lost as untrained:
    # taken back if a step from before it arrives late (the streams are not ordered).
    presumed_untrained: tuple[datetime, float] | None = None
    pending_since: datetime | None = None
    highest_step: int | None = None
    last_step: tuple[int, datetime] | None = None
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=_GAPS_KEPT))
    faults: deque[str] = field(default_factory=lambda: deque(maxlen=_FAULTS_KEPT))

    def step_seconds(self) -> float:
        """The median of the recent rank-0 step times (0 before two steps)."""
        return statistics.median(self.gaps) if self.gaps else 0.0

    def lost(self, now: datetime) -> dict[str, float]:
        """Seconds lost so far, by cause (waiting counted up to ``now`` if still Pending)."""
        waiting = self.waiting
        if self.pending_since is not None:
            waiting += max((self._end(now) - self.pending_since).total_seconds(), 0.0)
        if not self.ran:  # it never ran: all its time so far went waiting for capacity
            waiting = self.wall(now)
        restart = self.restart
        if self.recovering_since is not None:
            restart += max((self._end(now) - self.recovering_since).total_seconds(), 0.0)
        return {
            "detection": self.detection,
            "restart": restart,
            "redone_steps": self.redone * self.step_seconds(),
            "waiting_for_capacity": waiting,
            "cluster_down": 0.0,  # see the module docstring
        }

    def wall(self, now: datetime) -> float:
        """Seconds from submission to ``now`` (or to the job's end)."""
        return max((self._end(now) - self.submitted).total_seconds(), 0.0)

    def goodput(self, now: datetime) -> float | None:
        """Productive time over wall time; None while no time has passed."""
        wall = self.wall(now)
        if wall <= 0:
            return None
        return max(wall - sum(self.lost(now).values()), 0.0) / wall

    def _end(self, now: datetime) -> datetime:
        return self.finished_at if self.finished_at is not None else now


class GoodputMeter:
    """The running goodput sums of every job a service sees."""

    def __init__(self, keep_finished: int = 100) -> None:
        self.keep_finished = keep_finished
        self.jobs: dict[str, JobGoodput] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()

    def phase(self, job: str, phase: JobPhase, submitted: datetime, at: datetime) -> None:
        """``job``'s record is in ``phase`` at ``at`` (submitted at ``submitted``).

        A record submitted anew (the same name again) starts the sums over."""
        known = self.jobs.get(job)
        if known is None or known.submitted != submitted:
            known = self.jobs[job] = JobGoodput(submitted=submitted)
            self._finished.pop(job, None)
        if known.finished_at is not None:
            return
        if phase is JobPhase.RUNNING:
            known.ran = True
        if known.pending_since is not None and phase is not JobPhase.PENDING:
            known.waiting += max((at - known.pending_since).total_seconds(), 0.0)
            known.pending_since = None
        elif known.ran and phase is JobPhase.PENDING and known.pending_since is None:
            known.pending_since = at
        if phase.finished:
            known.finished_at = at
            self._finished[job] = None
            while len(self._finished) > self.keep_finished:
                self.forget(next(iter(self._finished)))

    def fault(self, job: str, fault_id: str, detected: datetime, exited: datetime | None) -> None:
        """A fault of ``job`` detected at ``detected``; ``exited``: when the worker it
        names exited (None: not an exit, no detection time is counted)."""
        known = self.jobs.get(job)
        if known is None or exited is None or fault_id in known.faults:
            return
        known.faults.append(fault_id)
        known.detection += max((detected - exited).total_seconds(), 0.0)

    def recovering(self, job: str, detected: datetime) -> None:
        """A recovery of ``job`` began for a fault detected at ``detected``: one still
        open never ended (its generation faulted before it trained), and the time before
        the first recovery is lost if the job had not trained by then."""
        known = self.jobs.get(job)
        if known is None:
            return
        if known.recovering_since is not None:
            known.restart += max((detected - known.recovering_since).total_seconds(), 0.0)
        elif not known.recovered_before and not known.trained:
            presumed = max((detected - known.submitted).total_seconds(), 0.0)
            known.restart += presumed
            known.presumed_untrained = (detected, presumed)
        known.recovering_since = detected
        known.recovered_before = True

    def trained(self, job: str) -> None:
        """A generation of ``job`` trained (a step, or its ranks passed their rendezvous)."""
        known = self.jobs.get(job)
        if known is not None:
            known.trained = True

    def restarted(self, job: str, seconds: float) -> None:
        """A recovery or a resize of ``job`` took ``seconds`` (to the new generation's
        training); it ended."""
        known = self.jobs.get(job)
        if known is not None:
            known.restart += max(seconds, 0.0)
            known.recovering_since = None
            known.trained = True

    def step(self, job: str, step: int, at: datetime) -> None:
        """Rank 0 of ``job`` completed ``step`` at ``at``."""
        known = self.jobs.get(job)
        if known is None:
            return
        known.trained = True
        presumed = known.presumed_untrained
        if presumed is not None and at < presumed[0]:  # it had trained before the fault
            known.restart -= presumed[1]
            known.presumed_untrained = None
        if known.highest_step is not None and step <= known.highest_step:
            known.redone += 1
        else:
            known.highest_step = step
        last = known.last_step
        if last is not None and step > last[0]:
            known.gaps.append(max((at - last[1]).total_seconds(), 0.0) / (step - last[0]))
        known.last_step = (step, at)

    def forget(self, job: str) -> None:
        """Drop everything about ``job`` (deleted, or finished long enough ago)."""
        self.jobs.pop(job, None)
        self._finished.pop(job, None)
