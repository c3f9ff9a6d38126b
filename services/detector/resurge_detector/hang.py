"""Hang detector: a rank that is alive but makes no progress is a fault (pure logic, no I/O).

Per (job, generation, rank) it follows ``process_started``, ``progress``,
``process_state`` and ``process_exited``. An exit is stored in another stream than the
rest and may be read before a rank's last reports: those arm nothing once it exited
(until it starts again). A rank is overdue when, from the job's
``monitoring`` settings (defaults in :mod:`resurge.jobspec.monitoring`):

- it has not reported progress yet and ``startupTimeoutSeconds`` passed since it
  started; unset, only ranks that reported progress in an earlier generation get a
  learned start-up limit (``LEARNED_TIMEOUT_FACTOR`` times the longest start-up seen,
  at least ``LEARNED_STARTUP_FLOOR_SECONDS``);
- it has reported progress and ``heartbeatTimeoutSeconds`` passed since its last report;
  unset, the limit is learned as NVRx learns it: ``LEARNED_TIMEOUT_FACTOR`` times the
  longest gap between two reports of one rank seen in the job (any generation), at
  least ``LEARNED_HEARTBEAT_FLOOR_SECONDS``;
- its agent reported it stopped (``process_state``, ``stopped: true``: it runs no code)
  and for ``STOPPED_RANK_SECONDS`` neither has it run again nor has any rank of its
  generation reported progress. This needs no timeout: a stopped process cannot be slow.

A script that never reports progress (an unmodified torchrun script) is never judged by
the heartbeat (log rules with ``expectedRecurringFrequencyInSeconds`` do that), but a
stopped rank of it is a hang all the same; ``0`` turns a timeout off, and
``heartbeatTimeoutSeconds: 0`` turns the stopped-rank check off too.

Blame: a hang makes every peer wait on the culprit, so a job's generation gets one hang
fault, naming one rank: a rank reported stopped (the one stopped longest), else the rank
with the least progress (lowest last step, then the oldest last report) among those
that reported progress or are overdue. ``evidence.blamed`` says how it was chosen. The
fault id is ``hang:<job>:g<generation>:r<rank>`` (and the event id derives from it), so
a redelivered input or a restarted detector that blames the same rank is de-duplicated.

Times are this detector's own clock when an event arrives (``ctx.now``), never the
agents', so clock skew between nodes does not matter; each generation keeps its ranks'
waits as :class:`~resurge_detector.deadlines.Deadlines`.

A restart of the detector (:class:`~resurge.detection.DurableState`): every wait is
armed by an event, and a hung job sends none, so without more a detector restarted
during a hang (its last events acknowledged) would never judge it. Kept per job: the
newest generation's ranks, one entry per replica (``r<replica>``: run ``uid``,
generation, and per rank its replica, node, whether it reported progress in this
generation and whether it is stopped; a rank that exited is dropped), which change a
few times per rank and generation, never per report; and ``learned``, the job's pace,
which changes only when a longest interval grows (:mod:`resurge_detector.facts`). No
time is kept: a restarted detector arms each rank's wait (heartbeat if it reported
progress, else start-up; stopped as well if it was stopped) from its first reading of
its clock, so a hang under way is judged a whole limit after the restart, never sooner
(no false hang), and no time crosses from one process's monotonic clock to another's.
Why not arm them from the job records alone: a record names the generation and its
placements, not which ranks already reported progress (heartbeat or start-up limit),
matched a rule (a recurring frequency counts only after a first match) or exited, so
arming every rank of it would raise false hangs. The blame then knows no steps (a rank
that reports after the restart has the most progress). A hang already concluded is not
kept: concluded again after a restart it has the same id and is de-duplicated, and one
concluded but never published is not lost. An entry of another run, of a generation older than the
record's or of a finished job is dropped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from resurge.detection import DetectorContext, JobView
from resurge.events import (
    Envelope,
    FaultScope,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    Progress,
    RecoveryLevel,
)
from resurge.jobspec.monitoring import (
    LEARNED_HEARTBEAT_FLOOR_SECONDS,
    LEARNED_STARTUP_FLOOR_SECONDS,
    LEARNED_TIMEOUT_FACTOR,
    STOPPED_RANK_SECONDS,
    MonitoringSpec,
)
from resurge_detector.deadlines import Deadlines
from resurge_detector.facts import Entries, RanksByEntry, pack, replica_key, unpack

__all__ = ["HangDetector"]

_Events = ProcessStarted | Progress | ProcessStateChanged | ProcessExited


@dataclass
class _Rank:
    started: datetime
    replica: int | None
    node: str | None
    last_progress: datetime | None = None
    last_step: int | None = None
    stopped_since: datetime | None = None


@dataclass
class _Generation:
    uid: str | None = None  # the run's (its record's uid when the generation was first seen)
    ranks: dict[int, _Rank] = field(default_factory=dict)
    # Ranks that exited (until they start again): their late reports arm nothing.
    ended: set[int] = field(default_factory=set)
    last_progress: datetime | None = None  # any rank's
    reported: bool = False
    # Per rank: its start-up wait (since it started) or heartbeat wait (since its last report).
    waits: Deadlines[int] = field(default_factory=Deadlines)
    # Per stopped rank: quiet since it stopped or since any rank's last report, if later.
    stopped: Deadlines[int] = field(default_factory=lambda: Deadlines(at_limit=True))
    entries: RanksByEntry = field(default_factory=RanksByEntry)  # its ranks' durable entries

    def start(self, number: int, rank: _Rank) -> _Rank:
        """A rank (re)started at ``rank.started``: it waits for its first report."""
        self.ended.discard(number)
        self.ranks[number] = rank
        self.entries.file(number, rank.replica)
        self.waits.arm(number, rank.started, "startup")
        self.stopped.disarm(number)
        return rank

    def unseen(self, number: int, rank: _Rank) -> _Rank | None:
        """A report of a rank whose start was not seen (the detector restarted): it
        counts from now; None for a rank that exited (its report was read after)."""
        return None if number in self.ended else self.start(number, rank)

    def end(self, number: int) -> None:
        """A rank exited: nothing is awaited of it."""
        self.ended.add(number)
        self.ranks.pop(number, None)
        self.entries.remove(number)
        self.waits.disarm(number)
        self.stopped.disarm(number)

    def stop(self, number: int, rank: _Rank, stopped: bool, now: datetime) -> bool:
        """Its agent reported the rank stopped (it runs no code) or running again; whether
        that changed its state."""
        changed = (rank.stopped_since is not None) != stopped
        if not stopped:
            rank.stopped_since = None
            self.stopped.disarm(number)
        elif rank.stopped_since is None:
            rank.stopped_since = now
            self.quiet(number, rank)
        return changed

    def progressed(self, number: int, now: datetime) -> None:
        """The rank reported progress: its next report is awaited, and the stopped ranks'
        quiet starts over (the job moved)."""
        self.waits.arm(number, now, "heartbeat")
        self.last_progress = now
        if self.stopped:
            for stopped in self.stopped:
                self.quiet(stopped, self.ranks[stopped])

    def facts(self, job: str, number: int, key: str) -> bytes | None:
        """What a restarted detector needs to arm the waits of this generation's ranks of
        one replica again (packed); None when it has none."""
        ranks: dict[str, list[Any]] = {}
        for n in self.entries.ranks(key):
            r = self.ranks[n]
            ranks[str(n)] = [
                r.replica,
                r.node,
                r.last_progress is not None,
                r.stopped_since is not None,
            ]
        if not ranks:
            return None
        return pack(job, {"uid": self.uid, "generation": number, "ranks": ranks})

    def quiet(self, number: int, rank: _Rank) -> None:
        """Arm the stopped rank's deadline: quiet since it stopped or since the
        generation's last report, whichever is later."""
        if rank.stopped_since is not None:
            since = max(rank.stopped_since, self.last_progress or rank.started)
            self.stopped.arm(number, since, "stopped")


@dataclass
class _Learned:
    """What one job has shown, across its generations."""

    longest_gap: float = 0.0  # seconds between two progress reports of one rank
    longest_startup: float = 0.0  # seconds from a rank's start to its first report
    reporting_ranks: set[int] = field(default_factory=set)  # ranks that reported progress
    first_reporting_generation: int | None = None
    uid: str | None = None  # the run's

    def facts(self, job: str) -> bytes | None:
        return pack(
            job,
            {
                "uid": self.uid,
                "longest_gap": self.longest_gap,
                "longest_startup": self.longest_startup,
                "reporting_ranks": sorted(self.reporting_ranks),
                "first_reporting_generation": self.first_reporting_generation,
            },
        )


@dataclass(frozen=True)
class _Overdue:
    rank: int
    what: str  # startup, heartbeat or stopped
    limit: float
    limit_source: str  # explicit, learned or stopped
    silent: float


class HangDetector:
    """Ranks alive but making no progress: one hang fault per job generation."""

    name = "hang"
    kinds = frozenset({"process_started", "progress", "process_state", "process_exited"})

    def __init__(self) -> None:
        self._generations: dict[tuple[str, int], _Generation] = {}
        self._newest: dict[str, int] = {}
        self._learned: dict[str, _Learned] = {}
        self._entries = Entries()  # per job: "learned", and one entry per replica
        self._restored: dict[tuple[str, str], dict[str, Any]] = {}  # armed on first use

    # -- events -------------------------------------------------------------------------

    def observe(self, event: _Events, ctx: DetectorContext) -> list[Envelope]:
        """Follow a rank's start, progress, stopped state and exit; concludes nothing."""
        if self._restored:
            self._arm_restored(ctx)
        if event.job is None or event.generation is None or event.rank is None:
            return []
        generation = self._generation(event.job, event.generation, ctx)
        if generation is None:
            return []
        now = ctx.now
        # Progress first: it is nearly every event, and a model's failed isinstance is slow.
        if not isinstance(event, Progress | ProcessStateChanged):
            if isinstance(event, ProcessExited):
                generation.end(event.rank)
            elif isinstance(event, ProcessStarted):
                generation.start(event.rank, _Rank(now, event.replica, event.node))
            self._entries.touch(event.job, replica_key(event.replica))
            return []
        rank = generation.ranks.get(event.rank) or generation.unseen(
            event.rank, _Rank(now, event.replica, event.node)
        )
        if rank is None:  # read after its exit (another stream): it awaits nothing now
            return []
        if isinstance(event, Progress):
            self._progress(event.job, event.generation, event.rank, event.step, rank, now)
            generation.progressed(event.rank, now)
        elif generation.stop(event.rank, rank, event.stopped, now):
            self._entries.touch(event.job, replica_key(rank.replica))
        return []

    def forget_job(self, job: str) -> None:
        """A new run of ``job`` (:class:`~resurge.detection.ForgetsJobs`): its generations
        start again from 0, and it learns its own pace."""
        self._newest.pop(job, None)
        self._learned.pop(job, None)
        for key in [k for k in self._generations if k[0] == job]:
            del self._generations[key]
        for entry in [k for k in self._restored if k[0] == job]:
            del self._restored[entry]
        self._entries.touch_all(job)

    def _generation(self, job: str, number: int, ctx: DetectorContext) -> _Generation | None:
        """The state of ``job``'s generation ``number``; None for one older than the
        newest seen or than its record's."""
        newest = self._newest.get(job, -1)
        if number < newest:
            return None
        generation = self._generations.get((job, number))
        if generation is not None:
            return generation
        record = ctx.job(job)
        if record is not None and number < record.generation:
            # Read late, after its record moved on (the tick dropped it): a detector behind
            # must not make it again for every batch and rewrite its ranks' entries each time.
            return None
        if number > newest:
            self._newest[job] = number
            for key in [k for k in self._generations if k[0] == job and k[1] < number]:
                del self._generations[key]
        uid = None if record is None else record.uid
        generation = self._generations[(job, number)] = _Generation(uid)
        self._entries.touch_all(job)  # the older generation's entries go
        return generation

    # -- durable facts ------------------------------------------------------------------

    def state_changes(self) -> Mapping[tuple[str, str], bytes | None]:
        """The changed entries (:class:`~resurge.detection.DurableState`): the ranks of a
        job's newest generation, one entry per replica, and its learned pace; None
        deletes an entry no longer needed."""
        return self._entries.changes(self._entry)

    def _entry(self, job: str, key: str) -> bytes | None:
        if key == "learned":
            learned = self._learned.get(job)
            return None if learned is None else learned.facts(job)
        number = self._newest.get(job)
        generation = None if number is None else self._generations.get((job, number))
        if number is None or generation is None:
            return None
        return generation.facts(job, number, key)

    def restore_state(self, job: str, key: str, value: bytes) -> None:
        """A stored entry, given back at start: armed at the first reading of the clock."""
        self._entries.stored(job, key)
        self._restored[(job, key)] = unpack(value)

    def _arm_restored(self, ctx: DetectorContext) -> None:
        """Arm the restored generations' waits from ``ctx.now`` (see the module docstring):
        the learned pace first, then the newest generation's entries."""
        restored, self._restored = self._restored, {}
        for (job, key), facts in sorted(restored.items(), key=_learned_then_newest):
            record = ctx.job(job)
            if record is None or record.phase.finished or record.uid != facts["uid"]:
                self._entries.touch(job, key)  # not this run's, or over: the entry goes
            elif key == "learned":
                self._learned.setdefault(job, _restored_learned(facts))
            elif max(record.generation, self._newest.get(job, -1)) > facts["generation"]:
                self._entries.touch(job, key)  # of an older generation
            else:
                self._restore_generation(job, facts, ctx)

    def _restore_generation(self, job: str, facts: dict[str, Any], ctx: DetectorContext) -> None:
        generation = self._generation(job, int(facts["generation"]), ctx)
        assert generation is not None  # nothing newer is known: checked by the caller
        now = ctx.now
        for number, (replica, node, progressed, stopped) in facts["ranks"].items():
            rank = generation.start(int(number), _Rank(now, replica, node))
            if progressed:
                rank.last_progress = now
                generation.progressed(int(number), now)
            if stopped:
                generation.stop(int(number), rank, True, now)

    def _progress(
        self, job: str, generation: int, number: int, step: int, rank: _Rank, now: datetime
    ) -> None:
        learned = self._learned.get(job)
        if learned is None:
            learned = self._learned[job] = _Learned(uid=self._run(job, generation))
        before = (learned.longest_startup, learned.longest_gap, len(learned.reporting_ranks))
        if rank.last_progress is None:
            self._entries.touch(job, replica_key(rank.replica))  # its first report here
            learned.longest_startup = max(
                learned.longest_startup, (now - rank.started).total_seconds()
            )
        elif now != rank.last_progress:  # reports handled at one time make no gap
            learned.longest_gap = max(
                learned.longest_gap, (now - rank.last_progress).total_seconds()
            )
        learned.reporting_ranks.add(number)
        if learned.first_reporting_generation is None:
            learned.first_reporting_generation = generation
        if before != (learned.longest_startup, learned.longest_gap, len(learned.reporting_ranks)):
            self._entries.touch(job, "learned")
        rank.last_progress, rank.last_step = now, step

    def _run(self, job: str, number: int) -> str | None:
        generation = self._generations.get((job, number))
        return None if generation is None else generation.uid

    # -- timeouts -----------------------------------------------------------------------

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        """One hang fault for each generation that has an overdue rank."""
        if self._restored:
            self._arm_restored(ctx)
        faults: list[Envelope] = []
        for key, generation in list(self._generations.items()):
            job, number = key
            record = ctx.job(job)
            if record is None or record.phase.finished or number < record.generation:
                del self._generations[key]
                self._entries.touch_all(job)
                if record is None or record.phase.finished:
                    self._learned.pop(job, None)
                    self._newest.pop(job, None)
                continue
            if generation.reported or not generation.ranks:
                continue
            overdue = self._overdue(record, number, generation, ctx.now)
            if overdue:
                generation.reported = True
                faults.append(self._fault(ctx, record, number, generation, overdue))
        return faults

    def _overdue(
        self, record: JobView, number: int, generation: _Generation, now: datetime
    ) -> list[_Overdue]:
        """The overdue ranks, in the generation's rank order. A stopped rank quiet for
        ``STOPPED_RANK_SECONDS`` is overdue as stopped; any other rank by its start-up or
        heartbeat limit, which is read now (the spec may have changed, or been learned)."""
        monitoring = record.spec.spec.monitoring
        learned = self._learned.get(record.name, _Learned())
        heartbeat = _heartbeat_limit(monitoring, learned)
        judge_stopped = monitoring.heartbeat_timeout_seconds != 0
        stopped_limit = STOPPED_RANK_SECONDS if judge_stopped else None
        stopped = {e.key: e for e in generation.stopped.expired(now, lambda _n, _w: stopped_limit)}
        sources: dict[int, str] = {}

        def limit(rank_number: int, what: str) -> float | None:
            if rank_number in stopped:
                return None
            if what == "startup":
                found = _startup_limit(monitoring, learned, number, rank_number)
            else:
                found = heartbeat
            if found is None:
                return None
            sources[rank_number] = found[1]
            return found[0]

        late = {e.key: e for e in generation.waits.expired(now, limit)}
        out: list[_Overdue] = []
        for rank_number in generation.ranks:
            if rank_number in stopped:
                quiet = stopped[rank_number].waited
                out.append(_Overdue(rank_number, "stopped", STOPPED_RANK_SECONDS, "stopped", quiet))
            elif rank_number in late:
                e = late[rank_number]
                out.append(_Overdue(rank_number, e.what, e.limit, sources[rank_number], e.waited))
        return out

    # -- output -------------------------------------------------------------------------

    def _fault(
        self,
        ctx: DetectorContext,
        record: JobView,
        number: int,
        generation: _Generation,
        overdue: list[_Overdue],
    ) -> Envelope:
        stopped = [o for o in overdue if o.what == "stopped"]
        ranks = generation.ranks
        if stopped:
            culprit = min(stopped, key=lambda o: (ranks[o.rank].stopped_since, o.rank))
            blamed, how = "stopped", "its agent reported it stopped"
        else:
            late = {o.rank: o for o in overdue}
            judged = [n for n, r in ranks.items() if r.last_progress is not None or n in late]
            chosen = min(judged, key=lambda n: _least_progress(n, ranks[n]))
            # The chosen rank may not be overdue itself (its peers ran on a little, then
            # waited on it): it is judged by the timeout its longest-silent peer passed.
            tripped = late.get(chosen) or max(overdue, key=lambda o: o.silent)
            silent = (ctx.now - _last_sign(ranks[chosen])).total_seconds()
            culprit = _Overdue(chosen, tripped.what, tripped.limit, tripped.limit_source, silent)
            blamed, how = "least_progress", "it made the least progress of the ranks judged"
        rank = ranks[culprit.rank]
        fault_id = f"hang:{record.name}:g{number}:r{culprit.rank}"
        if culprit.what == "stopped":
            message = (
                f"rank {culprit.rank} is stopped and its job made no progress for "
                f"{culprit.silent:.1f} s"
            )
        else:
            message = (
                f"rank {culprit.rank} sent no progress for {culprit.silent:.1f} s "
                f"({culprit.what} timeout {culprit.limit:g} s, {culprit.limit_source})"
            )
        message += f"; blamed because {how}"
        evidence: dict[str, Any] = {
            "timeout": culprit.what,
            "limit_seconds": culprit.limit,
            "limit_source": culprit.limit_source,
            "silent_seconds": round(culprit.silent, 3),
            "last_step": rank.last_step,
            "blamed": blamed,
            "overdue_ranks": ",".join(str(o.rank) for o in sorted(overdue, key=lambda o: o.rank)),
            "stopped": rank.stopped_since is not None,
        }
        return ctx.fault(
            fault_id=fault_id,
            reason="hang",
            scope=FaultScope.PROCESS,
            message=message,
            evidence=evidence,
            suggested_level=RecoveryLevel.PROCESS,
            id="hang-" + hashlib.sha256(fault_id.encode()).hexdigest()[:40],
            job=record.name,
            generation=number,
            rank=culprit.rank,
            replica=rank.replica,
            node=rank.node,
        )


def _heartbeat_limit(monitoring: MonitoringSpec, learned: _Learned) -> tuple[float, str] | None:
    """(seconds, where they come from) for a rank that has reported progress; None: off."""
    explicit = monitoring.heartbeat_timeout_seconds
    if explicit is not None:
        return None if explicit == 0 else (explicit, "explicit")
    return max(LEARNED_HEARTBEAT_FLOOR_SECONDS, LEARNED_TIMEOUT_FACTOR * learned.longest_gap), (
        "learned"
    )


def _startup_limit(
    monitoring: MonitoringSpec, learned: _Learned, generation: int, rank: int
) -> tuple[float, str] | None:
    explicit = monitoring.startup_timeout_seconds
    if explicit is not None:
        return None if explicit == 0 else (explicit, "explicit")
    first = learned.first_reporting_generation
    if first is None or generation <= first or rank not in learned.reporting_ranks:
        return None
    if monitoring.heartbeat_timeout_seconds == 0:
        return None
    seconds = max(LEARNED_STARTUP_FLOOR_SECONDS, LEARNED_TIMEOUT_FACTOR * learned.longest_startup)
    return seconds, "learned"


def _learned_then_newest(item: tuple[tuple[str, str], dict[str, Any]]) -> tuple[bool, int]:
    (_, key), facts = item
    return key != "learned", -int(facts.get("generation", 0))


def _restored_learned(facts: dict[str, Any]) -> _Learned:
    return _Learned(
        longest_gap=float(facts["longest_gap"]),
        longest_startup=float(facts["longest_startup"]),
        reporting_ranks=set(facts["reporting_ranks"]),
        first_reporting_generation=facts["first_reporting_generation"],
        uid=facts["uid"],
    )


def _last_sign(rank: _Rank) -> datetime:
    return rank.last_progress or rank.started


def _least_progress(number: int, rank: _Rank) -> tuple[int, datetime, int]:
    """Sort key: lowest last step first (none yet counts lowest), then the oldest report."""
    step = -1 if rank.last_step is None else rank.last_step
    return step, _last_sign(rank), number
