"""The fault lane: which lane hands a fault-grade raw event to which detector."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from resurge.control.records import JobRecord, Placement
from resurge.events import (
    Envelope,
    FaultDetected,
    JobPhase,
    LogLine,
    ProcessExited,
    Progress,
    Source,
)
from resurge.local import job_factory
from resurge_detector.hang import HangDetector
from resurge_detector.log_rules import LogRuleDetector
from resurge_detector.process_exit import ProcessExitDetector
from resurge_detector.runtime import LANE_KINDS, DetectorRuntime, Partition
from resurge_detector.straggler import StragglerDetector

SOURCE = Source(service="detector", instance="t")
NOW = datetime(2026, 1, 1, tzinfo=UTC)
OOM = {"name": "oom", "logPattern": "CUDA out of memory", "faultOnMatch": True}


def record(name: str, *rules: dict[str, object]) -> JobRecord:
    spec = job_factory.job(name, nproc=2, monitoring={"logRules": list(rules)}, preload=None)
    return JobRecord(
        name=name, spec=spec, phase=JobPhase.RUNNING, placements=[Placement(replica=0, node="n0")]
    )


def where(job: str) -> dict[str, Any]:
    return {"source": SOURCE, "job": job, "replica": 0, "node": "n0", "rank": 1, "generation": 0}


def crash(job: str) -> ProcessExited:
    return ProcessExited(pid=7, local_rank=1, local_world_size=2, exit_code=1, **where(job))


def line(job: str, text: str) -> LogLine:
    return LogLine(local_rank=1, stream="stderr", line=text, **where(job))


def reasons(out: list[Envelope]) -> list[str]:
    return [event.reason for event in out if isinstance(event, FaultDetected)]


class Counting:
    """A detector of one fault-grade kind that counts what it is handed."""

    name = "counting"
    kinds = frozenset({"process_exited"})

    def __init__(self) -> None:
        self.seen: list[str] = []

    def observe(self, event: Envelope, ctx: Any) -> list[Envelope]:
        self.seen.append(event.id)
        return []

    def tick(self, ctx: Any) -> list[Envelope]:
        return []


class Mixed(Counting):
    """A detector that reads exits beside telemetry, as the hang detector does."""

    name = "mixed"
    kinds = frozenset({"process_exited", "progress"})


def runtime(*detectors: Any) -> DetectorRuntime:
    return DetectorRuntime(list(detectors), SOURCE, Partition())


def test_lane_kinds_are_the_fault_grade_kinds_that_a_lane_only_detector_takes() -> None:
    assert {"process_exited", "worker_fault", "agent_state", "gpu_error"} == LANE_KINDS
    assert runtime(ProcessExitDetector(), HangDetector()).lane_kinds == {"process_exited"}
    assert runtime(HangDetector(), StragglerDetector()).lane_kinds == set()


def test_each_detector_gets_an_exit_once_lane_only_ones_from_the_fault_lane() -> None:
    only, mixed = Counting(), Mixed()
    rt = runtime(only, mixed)
    rt.set_job("j", record("j"))
    exit_ = crash("j")
    rt.observe_all([exit_], NOW, lane=True)
    assert (only.seen, mixed.seen) == ([exit_.id], [])
    rt.observe_all([exit_], NOW, lane=False)  # the main lane reaches it later
    assert (only.seen, mixed.seen) == ([exit_.id], [exit_.id])
    rt.observe_all([exit_], NOW, lane=True)  # redelivered to the fault lane: handled again
    assert only.seen == [exit_.id, exit_.id]


def test_an_exit_the_main_lane_handled_first_is_not_handled_again_by_the_fault_lane() -> None:
    only = Counting()
    rt = runtime(only)
    exit_ = crash("j")
    rt.observe_all([exit_], NOW, lane=False)
    rt.observe_all([exit_], NOW, lane=True)
    assert only.seen == [exit_.id]


def test_without_lanes_every_detector_gets_every_event_as_before() -> None:
    only, mixed = Counting(), Mixed()
    rt = runtime(only, mixed)
    exit_ = crash("j")
    rt.observe_all([exit_], NOW)
    assert (only.seen, mixed.seen) == ([exit_.id], [exit_.id])


def test_a_crash_comes_from_the_fault_lane_while_telemetry_before_it_waits() -> None:
    rt = runtime(ProcessExitDetector(), HangDetector(), LogRuleDetector())
    rt.set_job("quick", record("quick"))
    backlog: list[Envelope] = [
        Progress(local_rank=1, step=step, **where("quick")) for step in range(100)
    ]
    exit_ = crash("quick")
    # The fault lane has the exit while the 100 progress reports before it are unread.
    assert reasons(rt.observe_all([exit_], NOW, lane=True)) == ["process_crash"]
    # The main lane then reads the backlog and the exit: nothing concluded twice.
    assert reasons(rt.observe_all([*backlog, exit_], NOW, lane=False)) == []


def test_with_log_rules_the_exit_stays_in_order_behind_the_lines_before_it() -> None:
    rt = runtime(ProcessExitDetector(), LogRuleDetector())
    rt.set_job("ruled", record("ruled", OOM))
    oom, exit_ = line("ruled", "RuntimeError: CUDA out of memory"), crash("ruled")
    # The fault lane leaves it to the main lane: the log rule's fault must come first.
    assert rt.observe_all([exit_], NOW, lane=True) == []
    assert reasons(rt.observe_all([oom, exit_], NOW, lane=False)) == ["log_rule", "process_crash"]


def test_log_rules_keep_the_order_only_where_a_detector_reads_log_lines() -> None:
    rt = runtime(ProcessExitDetector())
    rt.set_job("ruled", record("ruled", OOM))
    assert reasons(rt.observe_all([crash("ruled")], NOW, lane=True)) == ["process_crash"]
