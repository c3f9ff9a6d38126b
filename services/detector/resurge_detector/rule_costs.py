"""What each job's log rules cost the detector, and which are suspended for it.

A user's pattern is matched in the detector's one thread: each search is bounded
(:mod:`resurge_detector.bounded_regex`), but a catastrophic pattern (``(a+)+$`` against
long lines of ``a``) spends its whole bound on every line, about 20 to 90 ms, and a job
printing many such lines would hold the detector for every other job of its partition.
So each (job, rule) gets a budget of search time per window (by default
:data:`RULE_BUDGET_SECONDS` in each :data:`RULE_WINDOW_SECONDS`, a tenth of one core); a
rule that spends more is suspended for that job: it matches nothing and awaits nothing
(no ``log_hang`` either: its lines are not read) until its patterns change (the user
fixed them) or the job's run ends. The detector announces the suspension once (see
:mod:`resurge_detector.log_rules`). Other jobs, and the job's other rules, go on.

Time is measured with :func:`time.perf_counter` around the searches themselves.
Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from resurge.jobspec import LogRule

__all__ = ["RULE_BUDGET_SECONDS", "RULE_WINDOW_SECONDS", "RuleCosts", "Spent"]

RULE_BUDGET_SECONDS = 1.0
RULE_WINDOW_SECONDS = 10.0


@dataclass
class Spent:
    """One (job, rule)'s searches in the current window."""

    since: float  # perf_counter time the window began
    seconds: float = 0.0
    lines: int = 0


class RuleCosts:
    """Search time per (job, rule) in tumbling windows, and the rules over budget."""

    def __init__(
        self,
        budget_seconds: float = RULE_BUDGET_SECONDS,
        window_seconds: float = RULE_WINDOW_SECONDS,
    ) -> None:
        self.budget = budget_seconds
        self.window = window_seconds
        self._spent: dict[tuple[str, str], Spent] = {}
        # (job, rule) -> the patterns it was suspended with: other patterns lift it.
        self._suspended: dict[tuple[str, str], tuple[str, str | None]] = {}

    def suspended(self, job: str, rule: LogRule) -> bool:
        """Whether ``rule`` is suspended for ``job`` (its patterns as they were then)."""
        patterns = self._suspended.get((job, rule.name))
        if patterns is None:
            return False
        if patterns == (rule.log_pattern, rule.stop_pattern):
            return True
        del self._suspended[(job, rule.name)]  # changed since: it runs again
        return False

    def spend(self, job: str, rule: LogRule, started: float, ended: float) -> Spent | None:
        """One line's searches of ``rule`` for ``job`` ran from ``started`` to ``ended``;
        what the window spent if that put the rule over budget (it is suspended now),
        else None."""
        key = (job, rule.name)
        spent = self._spent.get(key)
        if spent is None or started - spent.since > self.window:
            spent = self._spent[key] = Spent(started)
        spent.seconds += ended - started
        spent.lines += 1
        if spent.seconds <= self.budget:
            return None
        del self._spent[key]
        self._suspended[key] = (rule.log_pattern, rule.stop_pattern)
        return spent

    def forget(self, job: str) -> None:
        """A job's run is over (or a new one began): its costs and suspensions go."""
        for table in (self._spent, self._suspended):
            for key in [k for k in table if k[0] == job]:
                del table[key]
