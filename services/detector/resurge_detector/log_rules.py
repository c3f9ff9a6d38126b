"""Log-rule detector: a job's ``monitoring.logRules`` applied to its workers' output.

Pure logic, no I/O. The rules are HyperPod's logMonitoringConfiguration, read from the
job record on every call (a changed spec takes effect on the next event). State is
kept per (job, generation, rank, rule); an event of a newer generation drops the older
one's state, and events of older generations are ignored.

For each line of a rank a rule watches (``ranks``; unset: every rank), cut to
:data:`~resurge_detector.bounded_regex.MAX_LINE_CHARS`:

- a line matching ``stopPattern`` turns the rule off for that rank and generation;
- a line matching ``logPattern`` is a match: with ``faultOnMatch`` it fires
  (``log_rule``); with ``metricThreshold`` its first group is read as a number and the
  rule fires (``log_metric``) once ``value <operator> threshold`` held for
  ``metricEvaluationDataPoints`` matched values in a row (a value that does not hold
  restarts the count; a value that is not a number is skipped);
- a worker's exit (``process_exited``) carries its last output lines, which the rules
  with ``faultOnMatch`` judge as above: the exit is stored in another stream than the
  log lines and may be read before them, and the fault is the same either way;
- ``expectedStartCutOffInSeconds``: the first match must come this long after the
  rank's ``process_started``; ``expectedRecurringFrequencyInSeconds``: after a match
  the next must come this soon. A miss fires ``log_hang``: in :meth:`tick` when
  ``ctx.now`` passes the deadline, or on the late match itself.

One clock: every time here (a rank's start, a rule's matches, the deadlines and the
evidence) is this detector's own clock when the event arrived (``ctx.now``), never the
agent's ``event.time`` (a skewed node clock would otherwise move every deadline). The
waits are :class:`~resurge_detector.deadlines.Deadlines`, one per rank keyed by rule.

Blame: a ``log_hang`` of a rank while another rank of the job's generation is known
stopped (``process_state``, ``stopped: true``: it runs no code, and its peers wait on
it) names the stopped rank (the one stopped longest), as the hang detector does;
``evidence.blamed`` is ``stopped`` and ``evidence.late_rank`` the rank whose output was
late; otherwise the late rank itself (``blamed: late_rank``).

A rule whose searches cost the detector more than its budget for one job is suspended
for that job and announced once, as an alert (``log_rule_suspended``, scope ``job``,
``alert_only``: nothing restarts): see :mod:`resurge_detector.rule_costs`.

Each condition fires once per rank and generation, with a stable ``fault_id``
(``log_rule:<job>:g<gen>:r<rank>:<rule>:<what>``, the blamed rank) and an event id
derived from it. ``action: alert`` marks the fault ``alert_only``.

A restart of the detector (:class:`~resurge.detection.DurableState`): a deadline is
armed by an event, and after a restart no event may ever come again (a rank hung in
Python prints nothing more; its line was acknowledged before the restart). So what a
deadline needs to be armed again is durable, per job and replica (one entry each,
``r<replica>``: :mod:`resurge_detector.facts`): its generation and run (``uid``), and
per rank whether it started, which rules matched at least once, which a stop pattern
turned off and whether it is stopped. These change a few times per rank and generation
(never per line), so they are cheap to keep. What fired is not kept: a
fault concluded again after a restart has the same id, and is de-duplicated, while one
concluded but never published before the restart is not lost. The times
are not kept: a restarted detector arms every wait again from its first reading of its
clock, so each runs at least its whole limit after the restart (a deadline may come
late by the time the detector was away, never early: no false hang), and no time
crosses from one process's monotonic clock to another's. A stored entry of another run
of the job, of an older generation than the record's or of a finished job is dropped.
"""

from __future__ import annotations

import hashlib
import logging
import math
import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from resurge.detection import DetectorContext, JobView
from resurge.events import (
    Envelope,
    FaultDetected,
    FaultScope,
    LogLine,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    RecoveryLevel,
)
from resurge.jobspec import LogRule
from resurge.runtime.logs import RateLimitedLog
from resurge_detector.bounded_regex import (
    MAX_LINE_CHARS,
    BoundedPattern,
    LineBudget,
    Match,
    MatchTimeout,
    PatternCache,
)
from resurge_detector.deadlines import Deadlines
from resurge_detector.facts import Entries, RanksByEntry, pack, replica_key, unpack
from resurge_detector.rule_costs import RuleCosts, Spent

__all__ = ["EVIDENCE_LINE_CHARS", "LogRuleDetector"]

log = logging.getLogger("resurge.detector.log_rules")

EVIDENCE_LINE_CHARS = 500

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "gt": operator.gt,
    "lt": operator.lt,
    "eq": operator.eq,
    "gteq": operator.ge,
    "lteq": operator.le,
}


@dataclass
class _Seen:
    """What one rule has seen on one rank in one generation."""

    rule: LogRule
    first_match: datetime | None = None
    last_match: datetime | None = None
    streak: int = 0
    stopped: bool = False


@dataclass
class _Rank:
    replica: int | None = None
    node: str | None = None
    started: datetime | None = None
    stopped_since: datetime | None = None
    rules: dict[str, _Seen] = field(default_factory=dict)
    # Per rule: the first match awaited since the start, or the next since the last match.
    waits: Deadlines[str] = field(default_factory=Deadlines)

    def seen(self, rule: LogRule) -> _Seen:
        """This rule's state; a changed definition starts it over (what fired stays fired)."""
        seen = self.rules.get(rule.name)
        if seen is None or (seen.rule is not rule and seen.rule != rule):
            seen = self.rules[rule.name] = _Seen(rule)
            self._await_first(rule.name)
        return seen

    def start(self, now: datetime) -> None:
        """The rank (re)started: rules not matched yet await their first match from now."""
        self.started = now
        self.stopped_since = None
        for name, seen in self.rules.items():
            if seen.first_match is None and not seen.stopped:
                self._await_first(name)

    def matched(self, seen: _Seen, now: datetime) -> None:
        """A rule matched: its next match is awaited from now."""
        seen.first_match = seen.first_match or now
        seen.last_match = now
        self.waits.arm(seen.rule.name, now, "recurring")

    def stop(self, seen: _Seen) -> None:
        """A rule's stop pattern matched: nothing more is awaited of it."""
        seen.stopped = True
        self.waits.disarm(seen.rule.name)

    def forget(self, name: str) -> None:
        """A rule left the spec."""
        del self.rules[name]
        self.waits.disarm(name)

    def _await_first(self, name: str) -> None:
        if self.started is None:
            self.waits.disarm(name)
        else:
            self.waits.arm(name, self.started, "start")


@dataclass
class _Job:
    generation: int
    uid: str | None = None  # the run's (its record's uid when the job was first seen)
    ranks: dict[int, _Rank] = field(default_factory=dict)
    fired: set[str] = field(default_factory=set)
    entries: RanksByEntry = field(default_factory=RanksByEntry)  # its ranks' durable entries

    def facts(self, name: str, key: str) -> bytes | None:
        """What a restarted detector needs to arm the deadlines of this job's ranks of one
        replica again (packed); None when it has none."""
        # Per rank: [replica, node, started, stopped, rules matched, rules turned off].
        ranks: dict[str, list[Any]] = {}
        for number in self.entries.ranks(key):
            rank = self.ranks[number]
            ranks[str(number)] = [
                rank.replica,
                rank.node,
                rank.started is not None,
                rank.stopped_since is not None,
                sorted(n for n, s in rank.rules.items() if s.first_match),
                sorted(n for n, s in rank.rules.items() if s.stopped),
            ]
        if not ranks:
            return None
        return pack(name, {"uid": self.uid, "generation": self.generation, "ranks": ranks})

    def stopped(self) -> tuple[int, _Rank] | None:
        """The rank stopped longest (lowest number first), if any is stopped."""
        stopped = [(r.stopped_since, n, r) for n, r in self.ranks.items() if r.stopped_since]
        return min(stopped, key=lambda s: (s[0], s[1]))[1:] if stopped else None


class _Where(NamedTuple):
    job: str
    generation: int
    rank: int


class LogRuleDetector:
    """A job's ``monitoring.logRules`` applied to its workers' output."""

    name = "log_rules"
    kinds = frozenset({"log_line", "process_started", "process_state", "process_exited"})

    def __init__(self, costs: RuleCosts | None = None) -> None:
        self._jobs: dict[str, _Job] = {}
        self.costs = costs or RuleCosts()
        self._entries = Entries()  # per job: one entry per replica
        self._restored: dict[tuple[str, str], dict[str, Any]] = {}  # armed on first use
        self._patterns = PatternCache()
        self._slow = RateLimitedLog(log)
        # Lines on which some rule's search ran out of time (those rules skipped the line).
        self.lines_timed_out = 0

    # -- events -------------------------------------------------------------------------

    def observe(
        self,
        event: LogLine | ProcessStarted | ProcessStateChanged | ProcessExited,
        ctx: DetectorContext,
    ) -> list[Envelope]:
        """A log line against the rules (a rank's start and stop are followed too, and
        an exit's last output lines matched: see :meth:`_last_output`)."""
        if self._restored:
            self._arm_restored(ctx)
        if event.job is None or event.generation is None or event.rank is None:
            return []
        record = ctx.job(event.job)
        if record is None or event.generation < record.generation:
            return []
        job = self._job(event.job, event.generation, record.uid)
        if job is None:
            return []
        rank = job.ranks.get(event.rank)
        if rank is None:
            rank = job.ranks[event.rank] = _Rank()
            self._entries.touch(event.job, replica_key(event.replica))
            job.entries.file(event.rank, event.replica)
        elif rank.replica != event.replica:
            job.entries.file(event.rank, event.replica)
        rank.replica, rank.node = event.replica, event.node
        # Log lines first: they are nearly every event, and a model's failed isinstance
        # is slow.
        if isinstance(event, LogLine):
            where = _Where(event.job, event.generation, event.rank)
            return self._line(event, record, job, where, rank, ctx)
        if isinstance(event, ProcessExited):
            where = _Where(event.job, event.generation, event.rank)
            return self._last_output(event, record, job, where, rank, ctx)
        self._follow(event, event.job, rank, ctx.now)
        return []

    def _last_output(
        self,
        event: ProcessExited,
        record: JobView,
        job: _Job,
        where: _Where,
        rank: _Rank,
        ctx: DetectorContext,
    ) -> list[Envelope]:
        """A rank's exit: its last output lines against the rules that fire on a match,
        so a rule matching what a crashing worker printed last fires whether its log
        lines are read before the exit or after it (they travel in another stream); a
        rule fires once per rank and generation either way, with the same fault. A stop
        pattern among those lines turns a rule off for the lines after it only here (an
        earlier match may still come as a log line), and nothing is armed or counted
        for a rank that runs no more."""
        rules = [
            rule
            for rule in record.spec.spec.monitoring.log_rules
            if rule.fault_on_match
            and (rule.ranks is None or where.rank in rule.ranks)
            and not self.costs.suspended(where.job, rule)
        ]
        faults: list[Envelope] = []
        off: set[str] = set()
        for line in event.last_output if rules else ():
            text = line[:MAX_LINE_CHARS]
            budget = LineBudget()
            for rule in rules:
                patterns = self._compiled(rule)
                if patterns is None or rule.name in off or rank.seen(rule).stopped:
                    continue
                if self.costs.suspended(where.job, rule):
                    continue
                pattern, stop = patterns
                started = time.perf_counter()
                try:
                    if stop is not None and budget.search(stop, text) is not None:
                        off.add(rule.name)
                    elif budget.search(pattern, text) is not None:
                        faults += self._matched(rule, text, job, where, rank, ctx)
                except MatchTimeout:
                    self.lines_timed_out += 1
                over = self.costs.spend(where.job, rule, started, time.perf_counter())
                if over is not None:
                    faults.append(self._suspend(rule, over, where, rank, ctx))
        return faults

    def _matched(
        self, rule: LogRule, text: str, job: _Job, where: _Where, rank: _Rank, ctx: DetectorContext
    ) -> list[Envelope]:
        """The fault of a ``faultOnMatch`` rule's match of line ``text`` (once)."""
        line = text[:EVIDENCE_LINE_CHARS]
        evidence = {"rule": rule.name, "line": line}
        message = f"rank {where.rank}: log rule {rule.name!r} matched: {line[:200]}"
        return self._fire(rule, job, where, rank, ctx, "match", "log_rule", message, evidence)

    def _follow(
        self, event: ProcessStarted | ProcessStateChanged, job: str, rank: _Rank, now: datetime
    ) -> None:
        """A rank's start, or its agent's word that it stopped or runs again."""
        if isinstance(event, ProcessStarted):
            rank.start(now)
            self._entries.touch(job, replica_key(rank.replica))
        elif isinstance(event, ProcessStateChanged):
            if (rank.stopped_since is not None) != event.stopped:
                self._entries.touch(job, replica_key(rank.replica))
            if not event.stopped:
                rank.stopped_since = None
            elif rank.stopped_since is None:
                rank.stopped_since = now

    def forget_job(self, job: str) -> None:
        """A new run of ``job`` (:class:`~resurge.detection.ForgetsJobs`): its rules start
        over from its generation 0."""
        self._jobs.pop(job, None)
        for entry in [k for k in self._restored if k[0] == job]:
            del self._restored[entry]
        self._entries.touch_all(job)
        self.costs.forget(job)

    def _job(self, name: str, generation: int, uid: str | None) -> _Job | None:
        job = self._jobs.get(name)
        if job is None or generation > job.generation:
            job = self._jobs[name] = _Job(generation, uid)
            self._entries.touch_all(name)  # the older generation's entries go
        return job if generation == job.generation else None

    # -- durable facts ------------------------------------------------------------------

    def state_changes(self) -> Mapping[tuple[str, str], bytes | None]:
        """The changed entries (:class:`~resurge.detection.DurableState`): the facts of a
        job's ranks, one entry per replica; None deletes an entry no longer needed."""
        return self._entries.changes(self._entry)

    def _entry(self, name: str, key: str) -> bytes | None:
        job = self._jobs.get(name)
        return None if job is None else job.facts(name, key)

    def restore_state(self, job: str, key: str, value: bytes) -> None:
        """A stored entry, given back at start: its waits are armed again at the first
        reading of the clock (the first event or tick)."""
        self._entries.stored(job, key)
        self._restored[(job, key)] = unpack(value)

    def _arm_restored(self, ctx: DetectorContext) -> None:
        """Arm the restored jobs' waits from ``ctx.now`` (see the module docstring), the
        newest generation's entries first."""
        restored, self._restored = self._restored, {}
        for (name, key), facts in sorted(restored.items(), key=lambda i: -i[1]["generation"]):
            record = ctx.job(name)
            generation = int(facts["generation"])
            known = self._jobs.get(name)
            if (
                record is None
                or record.phase.finished
                or record.uid != facts["uid"]
                or record.generation > generation
                or (known is not None and known.generation != generation)
            ):
                self._entries.touch(name, key)  # not this run's, or over: the entry goes
                continue
            job = self._job(name, generation, record.uid)
            assert job is not None  # nothing newer is known: checked above
            self._restore_ranks(job, record, facts["ranks"], ctx.now)

    @staticmethod
    def _restore_ranks(
        job: _Job, record: JobView, ranks: dict[str, list[Any]], now: datetime
    ) -> None:
        rules = {rule.name: rule for rule in record.spec.spec.monitoring.log_rules}
        for number, known in ranks.items():
            replica, node, was_started, was_stopped, matched, off = known
            rank = job.ranks[int(number)] = _Rank(replica, node)
            job.entries.file(int(number), replica)
            if was_started:
                rank.start(now)
            if was_stopped:
                rank.stopped_since = now
            for rule_name in matched:
                if rule_name in rules:
                    rank.matched(rank.seen(rules[rule_name]), now)
            for rule_name in off:
                if rule_name in rules:
                    rank.stop(rank.seen(rules[rule_name]))

    def _line(
        self,
        event: LogLine,
        record: JobView,
        job: _Job,
        where: _Where,
        rank: _Rank,
        ctx: DetectorContext,
    ) -> list[Envelope]:
        rules = record.spec.spec.monitoring.log_rules
        text = event.line[:MAX_LINE_CHARS]
        budget = LineBudget()
        timed_out = False
        faults: list[Envelope] = []
        for rule in rules:
            if rule.ranks is not None and where.rank not in rule.ranks:
                continue
            if self.costs.suspended(where.job, rule):
                continue
            started = time.perf_counter()
            try:
                faults += self._apply(rule, event, text, budget, job, where, rank, ctx)
            except MatchTimeout as error:
                timed_out = True
                self._slow.warning(
                    f"{where.job}:{rule.name}",
                    f"log rule {rule.name!r} skipped a line of rank {where.rank}: {error}",
                    job=where.job,
                    rank=where.rank,
                    reason="log_rule_timeout",
                )
            over = self.costs.spend(where.job, rule, started, time.perf_counter())
            if over is not None:
                faults.append(self._suspend(rule, over, where, rank, ctx))
        if timed_out:
            self.lines_timed_out += 1
        return faults

    def _suspend(
        self, rule: LogRule, spent: Spent, where: _Where, rank: _Rank, ctx: DetectorContext
    ) -> FaultDetected:
        """The alert that ``rule`` is suspended for the job (see :mod:`.rule_costs`)."""
        patterns = f"{rule.log_pattern}\n{rule.stop_pattern or ''}"
        digest = hashlib.sha256(patterns.encode()).hexdigest()[:12]
        fault_id = f"log_rule_suspended:{where.job}:{rule.name}:{digest}"
        message = (
            f"log rule {rule.name!r} suspended for this job: its patterns took "
            f"{spent.seconds:.2f} s of the detector's time for {spent.lines} line(s), over "
            f"its budget of {self.costs.budget:g} s per {self.costs.window:g} s; it matches "
            "and awaits nothing until its patterns change"
        )
        self._slow.warning(
            fault_id, message, job=where.job, rank=where.rank, reason="log_rule_suspended"
        )
        return ctx.fault(
            fault_id=fault_id,
            reason="log_rule_suspended",
            scope=FaultScope.JOB,
            message=message,
            evidence={
                "rule": rule.name,
                "log_pattern": rule.log_pattern[:EVIDENCE_LINE_CHARS],
                "seconds": round(spent.seconds, 3),
                "lines": spent.lines,
                "budget_seconds": self.costs.budget,
                "window_seconds": self.costs.window,
            },
            alert_only=True,
            id="log-rule-" + hashlib.sha256(fault_id.encode()).hexdigest()[:40],
            job=where.job,
            generation=where.generation,
            rank=where.rank,
            replica=rank.replica,
            node=rank.node,
        )

    def _apply(
        self,
        rule: LogRule,
        event: LogLine,
        text: str,
        budget: LineBudget,
        job: _Job,
        where: _Where,
        rank: _Rank,
        ctx: DetectorContext,
    ) -> list[Envelope]:
        patterns = self._compiled(rule)
        if patterns is None:
            return []
        seen = rank.seen(rule)
        if seen.stopped:
            return []
        pattern, stop = patterns
        if stop is not None and budget.search(stop, text) is not None:
            rank.stop(seen)
            self._entries.touch(where.job, replica_key(rank.replica))
            return []
        match = budget.search(pattern, text)
        if match is None:
            return []
        faults = self._late(rule, seen, job, where, rank, ctx)
        if seen.first_match is None:
            self._entries.touch(where.job, replica_key(rank.replica))
        rank.matched(seen, ctx.now)
        if rule.fault_on_match:
            faults += self._matched(rule, text, job, where, rank, ctx)
        elif rule.metric_threshold is not None and rule.operator is not None:
            line = text[:EVIDENCE_LINE_CHARS]
            faults += self._metric(rule, seen, match, line, job, where, rank, ctx)
        return faults

    def _compiled(self, rule: LogRule) -> tuple[BoundedPattern, BoundedPattern | None] | None:
        """The rule's (logPattern, stopPattern or None), or None when one does not compile."""
        pattern = self._patterns.get(rule.name, rule.log_pattern)
        if pattern is None:
            return None
        if rule.stop_pattern is None:
            return pattern, None
        stop = self._patterns.get(rule.name, rule.stop_pattern)
        return None if stop is None else (pattern, stop)

    def _metric(
        self,
        rule: LogRule,
        seen: _Seen,
        match: Match,
        line: str,
        job: _Job,
        where: _Where,
        rank: _Rank,
        ctx: DetectorContext,
    ) -> list[Envelope]:
        threshold, how = rule.metric_threshold, rule.operator
        value = _number(match)
        if threshold is None or how is None or value is None:
            return []
        if not _COMPARE[how](value, threshold):
            seen.streak = 0
            return []
        seen.streak += 1
        if seen.streak < rule.metric_evaluation_data_points:
            return []
        evidence = {
            "rule": rule.name,
            "line": line,
            "value": value,
            "threshold": threshold,
            "operator": how,
            "data_points": rule.metric_evaluation_data_points,
        }
        message = (
            f"rank {where.rank}: log rule {rule.name!r}: value {value:g} {how} {threshold:g} "
            f"for {seen.streak} value(s) in a row"
        )
        return self._fire(rule, job, where, rank, ctx, "metric", "log_metric", message, evidence)

    # -- timeouts -----------------------------------------------------------------------

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        """``log_hang`` faults for the rules whose next match is overdue now."""
        if self._restored:
            self._arm_restored(ctx)
        faults: list[Envelope] = []
        for name, job in list(self._jobs.items()):
            record = ctx.job(name)
            if record is None or record.phase.finished or record.generation > job.generation:
                del self._jobs[name]
                self._entries.touch_all(name)
                if record is None or record.phase.finished:
                    self.costs.forget(name)
                continue
            faults += self._overdue(name, job, record, ctx)
        return faults

    def _overdue(
        self, name: str, job: _Job, record: JobView, ctx: DetectorContext
    ) -> list[Envelope]:
        """``log_hang`` faults of one job's ranks whose next match is overdue now."""
        faults: list[Envelope] = []
        rules = {rule.name: rule for rule in record.spec.spec.monitoring.log_rules}
        # A rule without a time limit is never late (its state is renewed on its next line);
        # a suspended one reads no line, so it cannot be late either.
        timed = [
            rule
            for rule in rules.values()
            if _timed(rule)
            and self._compiled(rule) is not None
            and not self.costs.suspended(name, rule)
        ]
        for number, rank in job.ranks.items():
            for gone in rank.rules.keys() - rules.keys():
                rank.forget(gone)
            if not timed or rank.replica in record.finished_replicas:
                continue
            where = _Where(name, job.generation, number)
            for rule in timed:
                if rule.ranks is None or number in rule.ranks:
                    faults += self._late(rule, rank.seen(rule), job, where, rank, ctx)
        return faults

    def _late(
        self,
        rule: LogRule,
        seen: _Seen,
        job: _Job,
        where: _Where,
        rank: _Rank,
        ctx: DetectorContext,
    ) -> list[Envelope]:
        """A hang if, at ``ctx.now``, the rule's next match is overdue."""
        if seen.stopped:
            return []

        def limit_of(what: str) -> float | None:
            if what == "start":
                return rule.expected_start_cut_off_in_seconds
            return rule.expected_recurring_frequency_in_seconds

        late = rank.waits.check(rule.name, ctx.now, limit_of)
        if late is None:
            return []
        limit, since, what, waited = late.limit, late.since, late.what, late.waited
        evidence = {
            "rule": rule.name,
            "timeout": what,
            "limit_seconds": limit,
            "waited_seconds": round(waited, 3),
            "since": since.isoformat(),
        }
        after = "the process started" if what == "start" else "the last match"
        message = (
            f"rank {where.rank}: log rule {rule.name!r} saw no match for {waited:.1f} s "
            f"after {after} (limit {limit:g} s)"
        )
        stopped = job.stopped()
        if stopped is None:
            evidence["blamed"] = "late_rank"
        else:
            number, rank = stopped
            evidence.update(blamed="stopped", late_rank=where.rank)
            message = f"rank {number} is stopped; " + message
            where = _Where(where.job, where.generation, number)
        return self._fire(rule, job, where, rank, ctx, what, "log_hang", message, evidence)

    # -- output -------------------------------------------------------------------------

    def _fire(
        self,
        rule: LogRule,
        job: _Job,
        where: _Where,
        rank: _Rank,
        ctx: DetectorContext,
        what: str,
        reason: str,
        message: str,
        evidence: dict[str, Any],
    ) -> list[Envelope]:
        fault_id = f"log_rule:{where.job}:g{where.generation}:r{where.rank}:{rule.name}:{what}"
        if fault_id in job.fired:
            return []
        job.fired.add(fault_id)
        fault: FaultDetected = ctx.fault(
            fault_id=fault_id,
            reason=reason,
            scope=FaultScope.PROCESS,
            message=message,
            evidence=evidence,
            suggested_level=RecoveryLevel.PROCESS,
            alert_only=rule.action == "alert",
            id="log-rule-" + hashlib.sha256(fault_id.encode()).hexdigest()[:40],
            job=where.job,
            generation=where.generation,
            rank=where.rank,
            replica=rank.replica,
            node=rank.node,
        )
        return [fault]


def _timed(rule: LogRule) -> bool:
    """Whether ``rule`` awaits its matches within a time (and so may be late)."""
    return (
        rule.expected_start_cut_off_in_seconds is not None
        or rule.expected_recurring_frequency_in_seconds is not None
    )


def _number(match: Match) -> float | None:
    """The first group as a number; None when it is missing or not a number."""
    if match.re.groups < 1:
        return None
    text = match.group(1)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value
