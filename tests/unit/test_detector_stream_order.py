"""The detector reads the fault-grade raw kinds from a stream of their own, so a worker's
exit may be read before or after the telemetry it sent before it. What the detectors
conclude does not depend on that order: a log rule matching a crashing worker's last
line gives the same faults, first the log rule's, whichever is read first (the exit
carries its last output lines); a rank's report read after its exit arms no hang."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from resurge.control.state.records import JobRecord, Placement
from resurge.events import (
    Envelope,
    FaultDetected,
    JobPhase,
    LogLine,
    ProcessExited,
    ProcessStarted,
    Progress,
    Source,
)
from resurge.local import job_factory
from resurge_detector.hang import HangDetector
from resurge_detector.log_rules import LogRuleDetector
from resurge_detector.process_exit import ProcessExitDetector
from resurge_detector.runtime import DetectorRuntime, Partition

SOURCE = Source(service="detector", instance="t")
NOW = datetime(2026, 1, 1, tzinfo=UTC)
OOM = {"name": "oom", "logPattern": "CUDA out of memory", "faultOnMatch": True}
LAST = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def record(name: str, *rules: dict[str, object], **monitoring: object) -> JobRecord:
    spec = job_factory.job(
        name, nproc=2, monitoring={"logRules": list(rules), **monitoring}, preload=None
    )
    return JobRecord(
        name=name, spec=spec, phase=JobPhase.RUNNING, placements=[Placement(replica=0, node="n0")]
    )


def where(job: str) -> dict[str, Any]:
    return {"source": SOURCE, "job": job, "replica": 0, "node": "n0", "rank": 1, "generation": 0}


def crash(job: str, *last: str) -> ProcessExited:
    return ProcessExited(
        pid=7, local_rank=1, local_world_size=2, exit_code=1, last_output=list(last), **where(job)
    )


def line(job: str, text: str) -> LogLine:
    return LogLine(local_rank=1, stream="stderr", line=text, **where(job))


def runtime(job: JobRecord) -> DetectorRuntime:
    # The order the entry points name them in (alphabetical): the exit's detector first.
    rt = DetectorRuntime(
        [HangDetector(), ProcessExitDetector(), LogRuleDetector()], SOURCE, Partition()
    )
    rt.set_job(job.name, job)
    return rt


def faults(out: list[Envelope]) -> list[tuple[object, ...]]:
    """Each fault as the restarter would read it (its time aside), in order."""
    return [
        (e.id, e.fault_id, e.reason, e.rank, e.scope, e.message, sorted(e.evidence.items()))
        for e in out
        if isinstance(e, FaultDetected)
    ]


@pytest.mark.parametrize("exit_first", [False, True], ids=["lines-first", "exit-first"])
def test_a_log_rule_on_the_last_line_gives_the_same_faults_in_either_order(
    exit_first: bool,
) -> None:
    job = record("ruled", OOM)
    backlog: list[Envelope] = [line("ruled", f"step {n}") for n in range(20)]
    lines = [*backlog, line("ruled", LAST)]
    exit_ = crash("ruled", "step 19", LAST)
    in_order = runtime(job).observe_all([*lines, exit_], NOW)
    read = runtime(job)
    if exit_first:  # the fault-grade stream is read before the telemetry stream
        got = read.observe_all([exit_], NOW) + read.observe_all(lines, NOW)
    else:
        got = read.observe_all(lines, NOW) + read.observe_all([exit_], NOW)
    assert [f[2] for f in faults(got)] == ["log_rule", "process_crash"]  # the rule's first
    assert faults(got) == faults(in_order)


def test_a_stop_pattern_in_the_last_lines_does_not_hide_an_earlier_match_read_later() -> None:
    rule = {**OOM, "stopPattern": "shutting down"}
    job = record("ruled", rule)
    read = runtime(job)
    exit_ = crash("ruled", "shutting down")
    assert [f[2] for f in faults(read.observe_all([exit_], NOW))] == ["process_crash"]
    # The match came before the stop line, further back than the exit's last lines.
    late = [line("ruled", LAST), line("ruled", "shutting down")]
    assert [f[2] for f in faults(read.observe_all(late, NOW))] == ["log_rule"]


def test_a_report_read_after_the_rank_exited_arms_no_hang() -> None:
    job = record("quiet", heartbeatTimeoutSeconds=2)
    read = runtime(job)
    started = ProcessStarted(pid=7, local_rank=1, local_world_size=2, **where("quiet"))
    done = ProcessExited(pid=7, local_rank=1, local_world_size=2, exit_code=0, **where("quiet"))
    late = Progress(local_rank=1, step=9, **where("quiet"))  # sent before the exit
    read.observe_all([started], NOW)
    read.observe_all([done], NOW)  # the exit's stream is read first
    read.observe_all([late], NOW + timedelta(seconds=1))
    assert faults(read.tick(NOW + timedelta(seconds=60))) == []
