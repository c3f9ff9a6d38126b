"""A detector restarted while a deadline is armed judges it all the same: the hang and
log-rule detectors keep what arms their waits as durable state, and a restarted one arms
them again from its first reading of the clock (never sooner: no false hang); the
node-health detector awaits a report from every node a running job is placed on. Pure,
through the runtime: its state is handed from one runtime to a fresh one as the state
store hands it over (tests/integration/test_detector_state.py has the store itself)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from resurge.control.state.records import JobRecord, Placement
from resurge.detection import Detector
from resurge.events import (
    Envelope,
    FaultDetected,
    JobPhase,
    LogLine,
    NodeReport,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    Progress,
    Source,
)
from resurge.local import job_factory
from resurge_detector.facts import MAX_BYTES, pack, unpack
from resurge_detector.hang import HangDetector
from resurge_detector.log_rules import LogRuleDetector
from resurge_detector.node_health import NodeHealthDetector
from resurge_detector.runtime import DetectorRuntime, Partition

SOURCE = Source(service="detector", instance="t")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LINE = {"name": "steps", "logPattern": r"step \d+", "expectedRecurringFrequencyInSeconds": 3}


def record(generation: int = 0, **monitoring: Any) -> JobRecord:
    spec = job_factory.job("j", nproc=2, monitoring=monitoring, preload=None)
    return JobRecord(
        name="j",
        spec=spec,
        phase=JobPhase.RUNNING,
        generation=generation,
        placements=[Placement(replica=0, node="n0")],
    )


def where(rank: int, generation: int = 0) -> dict[str, Any]:
    return {
        "source": SOURCE,
        "job": "j",
        "replica": 0,
        "node": "n0",
        "rank": rank,
        "generation": generation,
    }


def started(rank: int, generation: int = 0) -> ProcessStarted:
    return ProcessStarted(
        pid=100 + rank, local_rank=rank, local_world_size=2, **where(rank, generation)
    )


def exited(rank: int) -> ProcessExited:
    return ProcessExited(
        pid=100 + rank, local_rank=rank, local_world_size=2, exit_code=0, **where(rank)
    )


def line(rank: int, text: str) -> LogLine:
    return LogLine(local_rank=rank, stream="stdout", line=text, **where(rank))


def progress(rank: int, step: int) -> Progress:
    return Progress(local_rank=rank, step=step, **where(rank))


def stopped(rank: int) -> ProcessStateChanged:
    return ProcessStateChanged(
        pid=100 + rank, local_rank=rank, stopped=True, since=T0, **where(rank)
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def runtime(make: Callable[[], Detector], job: JobRecord) -> DetectorRuntime:
    fresh = DetectorRuntime([make()], SOURCE, Partition())
    fresh.set_job(job.name, job)
    return fresh


def restart(
    before: DetectorRuntime, make: Callable[[], Detector], job: JobRecord
) -> DetectorRuntime:
    """A fresh detector given back what ``before`` stored (as the state store does: the
    records first, then every stored entry)."""
    stored = {key: value for key, value in before.state_changes().items() if value is not None}
    after = runtime(make, job)
    for (detector, name, key), value in stored.items():
        assert after.restore_state(detector, name, key, value)
    return after


def faults(out: list[Envelope]) -> list[FaultDetected]:
    return [e for e in out if isinstance(e, FaultDetected)]


def first_fault(
    rt: DetectorRuntime, start: float, end: float
) -> tuple[float, FaultDetected] | None:
    """The first tick (every 0.1 s from ``start`` to ``end``) that concludes a fault."""
    for tenth in range(round(start * 10), round(end * 10) + 1):
        found = faults(rt.tick(at(tenth / 10)))
        if found:
            assert len(found) == 1, found
            return tenth / 10, found[0]
    return None


# -- log rules -------------------------------------------------------------------------


def test_a_rank_silent_since_before_the_restart_is_late_a_limit_after_it() -> None:
    """The rank printed its line at 1 s and hung; the detector restarted at 2 s (its
    first tick after the restart at 10 s): late at 13 s, not 4 s (false: the detector
    was not there) nor never (today's: no event arms the wait again)."""
    job = record(logRules=[LINE])
    before = runtime(LogRuleDetector, job)
    before.observe(started(0), at(0))
    before.observe(line(0, "step 1"), at(1))
    after = restart(before, LogRuleDetector, job)
    found = first_fault(after, 10, 30)
    assert found is not None, "the hang under way was forgotten by the restart"
    when, fault = found
    assert when == 13.1 and fault.reason == "log_hang" and fault.rank == 0
    assert fault.fault_id == "log_rule:j:g0:r0:steps:recurring"


def test_a_rule_not_matched_yet_awaits_nothing_after_a_restart() -> None:
    """A recurring frequency only counts after a first match: a rank still starting
    (nothing printed) is no hang after the restart either."""
    job = record(logRules=[LINE])
    before = runtime(LogRuleDetector, job)
    before.observe(started(0), at(0))
    before.observe(started(1), at(0))
    before.observe(line(1, "step 1"), at(1))
    after = restart(before, LogRuleDetector, job)
    assert [f.rank for f in faults(after.tick(at(5))) + faults(after.tick(at(8.2)))] == [1]
    assert faults(after.tick(at(100))) == []


def test_a_start_cut_off_counts_from_the_restart_and_a_stopped_rule_stays_off() -> None:
    rules = [
        {"name": "first", "logPattern": "ready", "expectedStartCutOffInSeconds": 10},
        {**LINE, "stopPattern": "done"},
    ]
    job = record(logRules=rules)
    before = runtime(LogRuleDetector, job)
    before.observe(started(0), at(0))
    before.observe(line(0, "step 1"), at(1))
    before.observe(line(0, "done"), at(2))  # "steps" is off for rank 0
    after = restart(before, LogRuleDetector, job)
    found = first_fault(after, 5, 40)
    assert found is not None
    when, fault = found
    assert when == 15.1 and fault.fault_id == "log_rule:j:g0:r0:first:start"
    assert first_fault(after, 15.2, 60) is None


def test_another_run_s_or_an_older_generation_s_facts_are_dropped_and_deleted() -> None:
    job = record(logRules=[LINE])
    newer = job.model_copy(update={"generation": 1})
    for now in (newer, record(logRules=[LINE])):  # a newer generation; a new run (uid)
        before = runtime(LogRuleDetector, job)
        before.observe(started(0), at(0))
        before.observe(line(0, "step 1"), at(1))
        after = restart(before, LogRuleDetector, now)
        assert first_fault(after, 5, 30) is None
        assert after.state_changes() == {("log_rules", "j", "r0"): None}


def test_facts_are_kept_per_replica_and_a_new_generation_s_replace_the_old() -> None:
    """One entry per replica: a change rewrites its replica's alone; a new generation
    deletes the entries of replicas it does not have."""
    job = record(logRules=[LINE])
    rt = runtime(LogRuleDetector, job)
    for rank in range(4):  # replicas 0 and 1, two ranks each
        rt.observe(started(rank).model_copy(update={"replica": rank // 2}), at(0))
    assert set(rt.state_changes()) == {("log_rules", "j", "r0"), ("log_rules", "j", "r1")}
    rt.observe(line(3, "step 1").model_copy(update={"replica": 1}), at(1))
    assert set(rt.state_changes()) == {("log_rules", "j", "r1")}
    assert rt.state_changes() == {}  # nothing changed since
    newer = job.model_copy(update={"generation": 1})
    rt.set_job("j", newer)
    rt.observe(started(0, generation=1), at(2))  # generation 1 has replica 0 only
    changes = rt.state_changes()
    assert changes[("log_rules", "j", "r1")] is None and changes[("log_rules", "j", "r0")]


# -- hang ------------------------------------------------------------------------------


def test_a_heartbeat_wait_is_armed_again_from_the_restart() -> None:
    job = record(heartbeatTimeoutSeconds=2, startupTimeoutSeconds=20)
    before = runtime(HangDetector, job)
    for rank in (0, 1):
        before.observe(started(rank), at(0))
        before.observe(progress(rank, 1), at(1))
    before.observe(progress(0, 2), at(1.5))
    after = restart(before, HangDetector, job)
    found = first_fault(after, 10, 30)
    assert found is not None, "the hang under way was forgotten by the restart"
    when, fault = found
    assert when == 12.1 and fault.reason == "hang" and fault.evidence["timeout"] == "heartbeat"


def test_a_rank_that_exited_or_never_reported_is_judged_as_it_was() -> None:
    job = record(heartbeatTimeoutSeconds=2, startupTimeoutSeconds=6)
    before = runtime(HangDetector, job)
    for rank in (0, 1):
        before.observe(started(rank), at(0))
    before.observe(progress(0, 1), at(1))
    before.observe(exited(0), at(1.5))  # done: nothing is awaited of it
    after = restart(before, HangDetector, job)
    found = first_fault(after, 10, 30)
    assert found is not None
    when, fault = found
    assert when == 16.1 and fault.rank == 1 and fault.evidence["timeout"] == "startup"


def test_a_stopped_rank_is_still_stopped_after_the_restart() -> None:
    job = record(heartbeatTimeoutSeconds=100)
    before = runtime(HangDetector, job)
    for rank in (0, 1):
        before.observe(started(rank), at(0))
        before.observe(progress(rank, 1), at(1))
    before.observe(stopped(1), at(1.2))
    after = restart(before, HangDetector, job)
    found = first_fault(after, 10, 30)
    assert found is not None
    when, fault = found
    assert when == 12.0 and fault.rank == 1 and fault.evidence["blamed"] == "stopped"


def test_the_learned_pace_outlives_the_restart() -> None:
    """Reports 200 s apart: the learned heartbeat limit is 5 x 200 s, not the 600 s floor
    a restarted detector would judge by if it forgot it (a false hang at 600 s)."""
    job = record(startupTimeoutSeconds=1000)
    before = runtime(HangDetector, job)
    before.observe(started(0), at(0))
    for step in range(3):
        before.observe(progress(0, step), at(200.0 * step))
    after = restart(before, HangDetector, job)
    after.tick(at(500))  # its first reading after the restart
    assert faults(after.tick(at(500 + 999))) == []
    [fault] = faults(after.tick(at(500 + 1001)))
    assert fault.evidence["limit_seconds"] == 1000 and fault.evidence["limit_source"] == "learned"


# -- node health -----------------------------------------------------------------------


def test_a_node_silent_since_before_the_restart_is_lost_a_limit_after_it() -> None:
    """Two nodes hold the job; n1 died just before the detector restarted, so the new one
    never hears it: lost once ``silence_seconds`` passed since the restart."""
    job = record()
    job = job.model_copy(
        update={"placements": [Placement(replica=0, node="n0"), Placement(replica=1, node="n1")]}
    )
    after = runtime(lambda: NodeHealthDetector(silence_seconds=5), job)
    n0 = NodeReport(source=SOURCE, node="n0", slots_total=2, slots_free=0, healthy=True)
    after.tick(at(10))  # the first tick after the restart
    for second in range(11, 16):
        after.observe(n0.model_copy(update={"id": f"n0-{second}"}), at(second))
        assert faults(after.tick(at(second))) == []
    [lost] = faults(after.tick(at(15.1)))
    assert (lost.reason, lost.node, lost.replica) == ("node_lost", "n1", 1)
    assert after.tick(at(15.2)) == []  # once


def test_facts_too_big_for_a_message_are_not_kept() -> None:
    """An entry over the bound is deleted (None), not written: a write that cannot
    succeed would hold back every ack of the raw events behind it."""
    noise = secrets.token_hex(MAX_BYTES)  # incompressible, twice the bound
    assert pack("j", {"ranks": noise}) is None
    assert unpack(pack("j", {"ranks": "small"}) or b"") == {"ranks": "small"}
