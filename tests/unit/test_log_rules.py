"""The log-rule detector: HyperPod's logMonitoringConfiguration semantics, pure logic."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from resurge.control.state.records import JobRecord, Placement
from resurge.detection import Detector, DetectorContext
from resurge.events import (
    Envelope,
    FaultDetected,
    FaultScope,
    LogLine,
    ProcessStarted,
    ProcessStateChanged,
    RecoveryLevel,
    Severity,
    Source,
)
from resurge.local import job_factory
from resurge_detector.bounded_regex import MAX_LINE_CHARS
from resurge_detector.log_rules import EVIDENCE_LINE_CHARS, LogRuleDetector
from resurge_detector.rule_costs import RuleCosts

SOURCE = Source(service="detector", instance="t")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(*rules: dict[str, object], generation: int = 0, name: str = "j") -> JobRecord:
    spec = job_factory.job(
        name,
        ["python", "train.py"],
        nproc=2,
        monitoring={"logRules": list(rules)},
        preload=None,
    )
    placements = [Placement(replica=0, node="n0"), Placement(replica=1, node="n1")]
    return JobRecord(name=name, spec=spec, generation=generation, placements=placements)


def ctx(job: JobRecord, at: float = 0.0) -> DetectorContext:
    return DetectorContext(now=T0 + timedelta(seconds=at), source=SOURCE, jobs={job.name: job})


def where(rank: int, generation: int, at: float) -> dict[str, Any]:
    return {
        "source": SOURCE,
        "job": "j",
        "replica": rank // 2,
        "node": f"n{rank // 2}",
        "rank": rank,
        "generation": generation,
        "time": T0 + timedelta(seconds=at),
    }


def line(text: str, *, rank: int = 0, generation: int = 0, at: float = 0.0) -> LogLine:
    return LogLine(local_rank=rank % 2, stream="stdout", line=text, **where(rank, generation, at))


def started(*, rank: int = 0, generation: int = 0, at: float = 0.0) -> ProcessStarted:
    return ProcessStarted(
        pid=100 + rank, local_rank=rank % 2, local_world_size=2, **where(rank, generation, at)
    )


def state(*, rank: int, stopped: bool = True, generation: int = 0) -> ProcessStateChanged:
    return ProcessStateChanged(
        pid=100 + rank, local_rank=rank % 2, stopped=stopped, since=T0, **where(rank, generation, 0)
    )


def faults(out: list[Envelope]) -> list[FaultDetected]:
    assert all(isinstance(event, FaultDetected) for event in out)
    return [event for event in out if isinstance(event, FaultDetected)]


ERROR = {"name": "oom", "logPattern": "CUDA out of memory", "faultOnMatch": True}
LOSS = {
    "name": "loss",
    "logPattern": r"loss: (\S+)",
    "metricThreshold": 2.5,
    "operator": "gt",
    "metricEvaluationDataPoints": 3,
}
HEARTBEAT = {
    "name": "steps",
    "logPattern": r"step \d+",
    "expectedStartCutOffInSeconds": 60,
    "expectedRecurringFrequencyInSeconds": 30,
}


def test_it_is_a_detector_built_without_arguments() -> None:
    detector = LogRuleDetector()
    assert isinstance(detector, Detector)
    assert detector.name == "log_rules"
    assert detector.kinds == {"log_line", "process_started", "process_state", "process_exited"}


def test_fault_on_match_fires_once() -> None:
    detector, job = LogRuleDetector(), record(ERROR)
    assert detector.observe(line("step 1"), ctx(job)) == []
    [fault] = faults(detector.observe(line("RuntimeError: CUDA out of memory", rank=3), ctx(job)))
    assert fault.fault_id == "log_rule:j:g0:r3:oom:match"
    assert fault.reason == "log_rule"
    assert fault.scope is FaultScope.PROCESS
    assert fault.suggested_level is RecoveryLevel.PROCESS
    assert not fault.alert_only and fault.severity is Severity.ERROR
    assert (fault.job, fault.generation, fault.rank, fault.replica, fault.node) == (
        "j",
        0,
        3,
        1,
        "n1",
    )
    assert fault.evidence["rule"] == "oom"
    assert fault.evidence["line"] == "RuntimeError: CUDA out of memory"
    assert detector.observe(line("CUDA out of memory again", rank=3), ctx(job)) == []


def test_the_same_fault_gets_the_same_event_id_in_a_fresh_detector() -> None:
    job = record(ERROR)
    [first] = LogRuleDetector().observe(line("CUDA out of memory"), ctx(job))
    [again] = LogRuleDetector().observe(line("CUDA out of memory"), ctx(job))
    assert first.id == again.id and len(first.id) <= 128


def test_evidence_line_is_cut() -> None:
    detector, job = LogRuleDetector(), record(ERROR)
    [fault] = faults(detector.observe(line("CUDA out of memory " + "x" * 2000), ctx(job)))
    assert isinstance(fault.evidence["line"], str)
    assert len(fault.evidence["line"]) == EVIDENCE_LINE_CHARS


def test_ranks_filter() -> None:
    detector, job = LogRuleDetector(), record({**ERROR, "ranks": [0, 2]})
    assert detector.observe(line("CUDA out of memory", rank=1), ctx(job)) == []
    assert detector.observe(line("CUDA out of memory", rank=3), ctx(job)) == []
    [fault] = faults(detector.observe(line("CUDA out of memory", rank=2), ctx(job)))
    assert fault.rank == 2


def test_metric_fires_after_consecutive_points_and_resets() -> None:
    detector, job = LogRuleDetector(), record(LOSS)

    def feed(*values: str) -> list[FaultDetected]:
        out: list[Envelope] = []
        for value in values:
            out += detector.observe(line(f"loss: {value}"), ctx(job))
        return faults(out)

    assert feed("2.6", "3.0") == []
    assert feed("2.5") == []  # not > 2.5: the count starts over
    assert feed("nan?", "2.51", "nan", "9") == []  # not numbers: skipped, no count, no reset
    assert feed("step 7") == []  # no match at all
    [fault] = feed("2.7")
    assert fault.reason == "log_metric"
    assert fault.fault_id == "log_rule:j:g0:r0:loss:metric"
    assert fault.evidence["value"] == 2.7
    assert fault.evidence["threshold"] == 2.5
    assert fault.evidence["operator"] == "gt"
    assert feed("3", "3", "3") == []  # fired once


def test_metric_with_one_data_point_and_lteq() -> None:
    rule = {**LOSS, "operator": "lteq", "metricThreshold": 0.05, "metricEvaluationDataPoints": 1}
    detector, job = LogRuleDetector(), record(rule)
    assert detector.observe(line("loss: 0.051"), ctx(job)) == []
    [fault] = faults(detector.observe(line("loss: 0.05"), ctx(job)))
    assert fault.evidence["value"] == 0.05 and fault.evidence["operator"] == "lteq"


@pytest.mark.parametrize(
    ("operator", "threshold", "values", "fires"),
    [
        ("eq", 0.5, ["0.50", "0.5"], True),
        ("eq", 0.5, ["0.51", "0.49"], False),
        ("lt", 1.0, ["0.5", "0.99"], True),
        ("lt", 1.0, ["1.0", "0.99"], False),
        ("gteq", 7.0, ["6.99"], False),
        ("gteq", 7.0, ["7"], True),
    ],
)
def test_operators(operator: str, threshold: float, values: list[str], fires: bool) -> None:
    rule = {**LOSS, "operator": operator, "metricThreshold": threshold}
    rule["metricEvaluationDataPoints"] = len(values)
    detector, job = LogRuleDetector(), record(rule)
    out: list[Envelope] = []
    for value in values:
        out += detector.observe(line(f"loss: {value}"), ctx(job))
    assert len(out) == (1 if fires else 0)


def test_start_cut_off_fires_in_tick_after_the_time() -> None:
    detector, job = LogRuleDetector(), record(HEARTBEAT)
    assert detector.observe(started(rank=1, at=10), ctx(job, 10)) == []
    assert detector.tick(ctx(job, 70)) == []  # exactly 60 s: not yet
    [fault] = faults(detector.tick(ctx(job, 71)))
    assert fault.reason == "log_hang"
    assert fault.fault_id == "log_rule:j:g0:r1:steps:start"
    assert fault.rank == 1 and fault.node == "n0"
    assert fault.evidence["waited_seconds"] == 61.0
    assert fault.evidence["limit_seconds"] == 60.0
    assert detector.tick(ctx(job, 200)) == []  # once


def test_start_cut_off_does_not_fire_when_matched_in_time() -> None:
    rule = {**HEARTBEAT, "expectedRecurringFrequencyInSeconds": None}
    detector, job = LogRuleDetector(), record(rule)
    detector.observe(started(at=0), ctx(job))
    assert detector.observe(line("step 1", at=59), ctx(job, 59)) == []
    assert detector.tick(ctx(job, 1000)) == []


def test_a_late_first_match_is_still_a_hang() -> None:
    detector, job = LogRuleDetector(), record(HEARTBEAT)
    detector.observe(started(at=0), ctx(job))
    [fault] = faults(detector.observe(line("step 1", at=90), ctx(job, 90)))
    assert fault.fault_id.endswith(":steps:start") and fault.reason == "log_hang"


def test_recurring_frequency() -> None:
    detector, job = LogRuleDetector(), record(HEARTBEAT)
    detector.observe(started(at=0), ctx(job))
    detector.observe(line("step 1", at=5), ctx(job, 5))
    detector.observe(line("step 2", at=30), ctx(job, 30))
    assert detector.tick(ctx(job, 55)) == []  # 25 s since the last match
    assert detector.observe(line("no step here", at=58), ctx(job, 58)) == []
    [fault] = faults(detector.tick(ctx(job, 61)))
    assert fault.fault_id == "log_rule:j:g0:r0:steps:recurring"
    assert fault.evidence["waited_seconds"] == 31.0
    assert fault.evidence["timeout"] == "recurring"
    assert detector.tick(ctx(job, 90)) == []


def test_deadlines_use_the_detectors_clock_not_the_agents() -> None:
    detector, job = LogRuleDetector(), record(HEARTBEAT)
    # The agent's clock is an hour ahead; the events arrive at 0, 5 and 30 s.
    detector.observe(started(at=3600), ctx(job, 0))
    detector.observe(line("step 1", at=3605), ctx(job, 5))
    assert detector.observe(line("step 2", at=3606), ctx(job, 30)) == []  # 25 s apart here
    assert detector.tick(ctx(job, 60)) == []  # 30 s after the last match's arrival
    [fault] = faults(detector.tick(ctx(job, 61)))
    assert fault.evidence["waited_seconds"] == 31.0
    assert fault.evidence["since"] == (T0 + timedelta(seconds=30)).isoformat()
    behind, job = LogRuleDetector(), record(HEARTBEAT)  # an hour behind: the start still counts
    behind.observe(started(at=-3600), ctx(job, 0))
    assert behind.tick(ctx(job, 59)) == []
    assert len(behind.tick(ctx(job, 61))) == 1


def test_a_late_rank_blames_a_stopped_rank_of_its_job_once() -> None:
    rule = {**HEARTBEAT, "expectedStartCutOffInSeconds": None}
    detector, job = LogRuleDetector(), record(rule)
    for rank in range(4):
        detector.observe(started(rank=rank), ctx(job))
        detector.observe(line("step 1", rank=rank), ctx(job, 1))
    detector.observe(state(rank=3), ctx(job, 2))  # rank 3 stopped; the others wait on it
    detector.observe(state(rank=2), ctx(job, 3))  # stopped later: not the one blamed
    [fault] = faults(detector.tick(ctx(job, 32)))  # every rank's output is late
    assert fault.reason == "log_hang" and fault.rank == 3 and fault.node == "n1"
    assert fault.fault_id == "log_rule:j:g0:r3:steps:recurring"
    assert fault.evidence["blamed"] == "stopped" and fault.evidence["late_rank"] == 0
    assert detector.tick(ctx(job, 100)) == []


def test_a_stopped_rank_that_runs_again_is_not_blamed() -> None:
    rule = {**HEARTBEAT, "expectedStartCutOffInSeconds": None, "ranks": [0]}
    detector, job = LogRuleDetector(), record(rule)
    detector.observe(line("step 1", rank=0), ctx(job, 1))
    detector.observe(state(rank=1), ctx(job, 2))
    detector.observe(state(rank=1, stopped=False), ctx(job, 3))
    [fault] = faults(detector.tick(ctx(job, 32)))
    assert fault.rank == 0 and fault.evidence["blamed"] == "late_rank"


def test_no_recurring_check_before_the_first_match() -> None:
    rule = {**HEARTBEAT, "expectedStartCutOffInSeconds": None}
    detector, job = LogRuleDetector(), record(rule)
    detector.observe(started(at=0), ctx(job))
    assert detector.tick(ctx(job, 1000)) == []
    detector.observe(line("step 1", at=1000), ctx(job, 1000))
    assert len(detector.tick(ctx(job, 1031))) == 1


def test_stop_pattern_silences_the_rule_for_that_rank() -> None:
    rule = {**HEARTBEAT, "stopPattern": "training done"}
    detector, job = LogRuleDetector(), record(rule, {**ERROR, "stopPattern": "training done"})
    detector.observe(started(rank=0, at=0), ctx(job))
    detector.observe(started(rank=1, at=0), ctx(job))
    detector.observe(line("step 1", rank=0, at=5), ctx(job, 5))
    assert detector.observe(line("training done", rank=0, at=6), ctx(job, 6)) == []
    assert detector.observe(line("CUDA out of memory", rank=0, at=7), ctx(job, 7)) == []
    assert detector.observe(line("step 2", rank=0, at=100), ctx(job, 100)) == []
    # rank 1 never stopped: its start cut-off still fires; rank 0's timeouts do not
    [fault] = faults(detector.tick(ctx(job, 1000)))
    assert fault.rank == 1 and fault.fault_id.endswith(":start")
    [fault] = faults(detector.observe(line("CUDA out of memory", rank=1), ctx(job, 1001)))
    assert fault.rank == 1


def test_alert_action_is_alert_only() -> None:
    detector, job = LogRuleDetector(), record({**ERROR, "action": "alert"})
    [fault] = faults(detector.observe(line("CUDA out of memory"), ctx(job)))
    assert fault.alert_only and fault.severity is Severity.WARNING


def test_a_spec_change_takes_effect_on_the_next_event() -> None:
    detector = LogRuleDetector()
    before = record(ERROR)
    assert detector.observe(line("NCCL watchdog timeout"), ctx(before)) == []
    nccl = {"name": "nccl", "logPattern": "NCCL watchdog", "faultOnMatch": True}
    after = record(nccl)
    [fault] = faults(detector.observe(line("NCCL watchdog timeout"), ctx(after)))
    assert fault.fault_id.endswith(":nccl:match")
    assert detector.observe(line("CUDA out of memory"), ctx(after)) == []  # rule gone
    changed = record({**ERROR, "logPattern": "out of memory"})
    assert len(detector.observe(line("host out of memory"), ctx(changed))) == 1


def test_a_changed_rule_starts_its_count_over() -> None:
    detector = LogRuleDetector()
    for _ in range(2):
        detector.observe(line("loss: 3"), ctx(record(LOSS)))
    changed = record({**LOSS, "metricThreshold": 2.0})
    assert detector.observe(line("loss: 3"), ctx(changed)) == []
    assert detector.observe(line("loss: 3"), ctx(changed)) == []
    assert len(detector.observe(line("loss: 3"), ctx(changed))) == 1


def test_a_removed_rule_no_longer_times_out() -> None:
    detector = LogRuleDetector()
    detector.observe(started(at=0), ctx(record(HEARTBEAT)))
    assert detector.tick(ctx(record(ERROR), 1000)) == []


def test_a_new_generation_starts_fresh_and_old_events_are_ignored() -> None:
    detector = LogRuleDetector()
    old = record(ERROR, LOSS, generation=0)
    detector.observe(line("CUDA out of memory"), ctx(old))
    detector.observe(line("loss: 3"), ctx(old))
    detector.observe(line("loss: 3"), ctx(old))
    new = record(ERROR, LOSS, generation=1)
    # the streak of two does not carry over: two more values are not enough
    assert detector.observe(line("loss: 3", generation=1), ctx(new)) == []
    assert detector.observe(line("loss: 3", generation=1), ctx(new)) == []
    [fault] = faults(detector.observe(line("CUDA out of memory", generation=1), ctx(new)))
    assert fault.fault_id == "log_rule:j:g1:r0:oom:match" and fault.generation == 1
    # a late line of generation 0 is stale
    assert detector.observe(line("loss: 3", generation=0), ctx(new)) == []
    assert len(detector.observe(line("loss: 3", generation=1), ctx(new))) == 1


def test_lines_of_a_generation_older_than_the_record_are_stale() -> None:
    detector, job = LogRuleDetector(), record(ERROR, generation=1)
    assert detector.observe(line("CUDA out of memory", generation=0), ctx(job)) == []
    assert len(detector.observe(line("CUDA out of memory", generation=1), ctx(job))) == 1


def test_tick_forgets_an_old_generation_and_finished_jobs() -> None:
    detector = LogRuleDetector()
    detector.observe(started(at=0), ctx(record(HEARTBEAT, generation=0)))
    assert detector.tick(ctx(record(HEARTBEAT, generation=1), 1000)) == []
    detector.observe(started(generation=1, at=0), ctx(record(HEARTBEAT, generation=1)))
    finished = record(HEARTBEAT, generation=1)
    finished.finished_replicas = [0]
    assert detector.tick(ctx(finished, 1000)) == []
    assert len(detector.tick(ctx(record(HEARTBEAT, generation=1), 1000))) == 1


def test_an_event_without_a_job_record_or_rank_is_ignored() -> None:
    detector, job = LogRuleDetector(), record(ERROR)
    other = record(ERROR, name="other")
    assert detector.observe(line("CUDA out of memory"), ctx(other)) == []
    unranked = LogLine(
        source=SOURCE, job="j", local_rank=0, stream="stderr", line="CUDA out of memory"
    )
    assert detector.observe(unranked, ctx(job)) == []


def test_pathological_pattern_is_bounded() -> None:
    evil = {"name": "evil", "logPattern": "(a+)+$", "faultOnMatch": True}
    # A budget no loaded machine spends: this is the per-line bound, not the rule's budget.
    detector = LogRuleDetector(RuleCosts(budget_seconds=3600.0))
    job = record(evil, ERROR)
    text = "a" * (MAX_LINE_CHARS - 1) + "b" + " CUDA out of memory"
    out: list[Envelope] = []
    for rank in range(10):
        out += detector.observe(line(text, rank=rank % 4), ctx(job))
    # every match was cut off by the regex timeout (how long it takes is a bench's matter)
    assert detector.lines_timed_out == 10
    assert out == []  # the memory error lies past the cut: the cut is applied before matching
    ok = faults(detector.observe(line("CUDA out of memory", rank=0), ctx(job)))
    assert [fault.fault_id for fault in ok] == ["log_rule:j:g0:r0:oom:match"]


def test_a_pattern_that_does_not_compile_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    job = record(ERROR)
    # validated specs cannot hold such a pattern: model_copy skips validation
    raw = job.spec.spec.monitoring.log_rules[0].model_copy(update={"log_pattern": "(unclosed"})
    monitoring = job.spec.spec.monitoring.model_copy(update={"log_rules": [raw]})
    spec = job.spec.model_copy(
        update={"spec": job.spec.spec.model_copy(update={"monitoring": monitoring})}
    )
    bad = job.model_copy(update={"spec": spec})
    detector = LogRuleDetector()
    assert detector.observe(line("(unclosed CUDA out of memory"), ctx(bad)) == []
    assert detector.tick(ctx(bad, 1000)) == []
    assert "does not compile" in caplog.text
