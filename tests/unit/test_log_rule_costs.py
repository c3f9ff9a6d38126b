"""A catastrophic log pattern of one job is suspended for that job, announced once as an
alert, and stops costing the detector; the other jobs of its partition are judged as
before (pure, through the runtime; the patterns run for real)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from resurge.control.state.records import JobRecord, Placement
from resurge.events import Envelope, FaultDetected, FaultScope, JobPhase, LogLine, Source
from resurge.local import job_factory
from resurge_detector.bounded_regex import PATTERN_TIMEOUT_SECONDS
from resurge_detector.log_rules import LogRuleDetector
from resurge_detector.rule_costs import RuleCosts
from resurge_detector.runtime import DetectorRuntime, Partition

SOURCE = Source(service="detector", instance="t")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
BUDGET = 0.2  # seconds of search time per window, for one job's rule
# Backtracks on every line of a's that ends otherwise: each search spends its whole bound.
CATASTROPHIC = {"name": "greedy", "logPattern": "(a+)+$", "faultOnMatch": True}
CUDA = {"name": "cuda", "logPattern": "CUDA error", "faultOnMatch": True}
EVIL_LINE = "a" * 4000 + "b"


def record(name: str, *rules: dict[str, Any]) -> JobRecord:
    spec = job_factory.job(name, nproc=1, monitoring={"logRules": list(rules)}, preload=None)
    return JobRecord(
        name=name, spec=spec, phase=JobPhase.RUNNING, placements=[Placement(replica=0, node="n0")]
    )


def line(job: str, text: str) -> LogLine:
    return LogLine(
        source=SOURCE,
        job=job,
        replica=0,
        node="n0",
        rank=0,
        generation=0,
        local_rank=0,
        stream="stdout",
        line=text,
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def faults(out: list[Envelope]) -> list[FaultDetected]:
    return [e for e in out if isinstance(e, FaultDetected)]


def partition(*jobs: JobRecord) -> tuple[DetectorRuntime, LogRuleDetector]:
    detector = LogRuleDetector(RuleCosts(budget_seconds=BUDGET, window_seconds=60))
    runtime = DetectorRuntime([detector], SOURCE, Partition())
    for job in jobs:
        runtime.set_job(job.name, job)
    return runtime, detector


def test_a_catastrophic_pattern_is_suspended_for_its_job_and_the_others_go_on() -> None:
    runtime, detector = partition(record("evil", CATASTROPHIC), record("good", CUDA))
    lines = []
    for _ in range(200):
        lines += [line("evil", EVIL_LINE), line("good", "step ok")]
    lines.append(line("good", "CUDA error: an illegal memory access"))
    out = faults(runtime.observe_all(lines, at(0)))
    assert [(f.job, f.reason) for f in out] == [
        ("evil", "log_rule_suspended"),
        ("good", "log_rule"),
    ]
    alert = out[0]
    assert alert.alert_only and alert.scope is FaultScope.JOB
    assert alert.evidence["rule"] == "greedy" and int(str(alert.evidence["lines"])) >= 1
    # Each of its searches ran out of time (so cost at least that much) until the budget
    # was spent; after that, none of the 200 lines was searched.
    assert detector.lines_timed_out <= BUDGET / PATTERN_TIMEOUT_SECONDS + 1
    # Announced once: more of its lines change nothing.
    assert faults(runtime.observe_all([line("evil", EVIL_LINE)] * 5, at(1))) == []
    assert detector.lines_timed_out <= BUDGET / PATTERN_TIMEOUT_SECONDS + 1


def test_a_suspended_rule_awaits_nothing_and_runs_again_once_its_pattern_changes() -> None:
    rule = {**CATASTROPHIC, "faultOnMatch": False, "expectedRecurringFrequencyInSeconds": 5}
    evil = record("evil", rule)
    runtime, _ = partition(evil)
    out = faults(runtime.observe_all([line("evil", EVIL_LINE)] * 50, at(0)))
    assert [f.reason for f in out] == ["log_rule_suspended"]
    assert faults(runtime.tick(at(100))) == []  # its lines are not read: it is never late
    fixed = {**CATASTROPHIC, "logPattern": "a+b$"}
    runtime.set_job("evil", evil.model_copy(update={"spec": record("evil", fixed).spec}))
    [fault] = faults(runtime.observe_all([line("evil", EVIL_LINE)], at(101)))
    assert (fault.reason, fault.evidence["rule"]) == ("log_rule", "greedy")


def test_an_ordinary_rule_under_the_default_budget_is_never_suspended() -> None:
    """A pattern with no required literal (every line is searched), 5 000 lines of a
    busy job in one window: far under its budget."""
    rule = {"name": "loss", "logPattern": r"(?i)loss[:=] *(nan|inf)", "faultOnMatch": True}
    detector = LogRuleDetector()
    runtime = DetectorRuntime([detector], SOURCE, Partition())
    runtime.set_job("busy", record("busy", rule))
    text = "epoch 3 step 1200 lr 0.0003 loss: 0.2731 tokens/s 18250 mem 61.2G " * 2
    for start in range(0, 5_000, 1000):
        assert faults(runtime.observe_all([line("busy", text)] * 1000, at(start / 1000))) == []
    assert faults(runtime.observe_all([line("busy", "loss: nan")], at(5))) != []
