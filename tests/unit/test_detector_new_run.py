"""A job deleted and submitted again under its name is a new run: the detectors judge it
from its own generation 0, with nothing of the old run (pure, through the runtime)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from resurge.control.state.records import JobRecord, Placement
from resurge.events import (
    FaultDetected,
    JobPhase,
    ProcessExited,
    ProcessStarted,
    ReplicaFinished,
    Source,
)
from resurge.local import job_factory
from resurge_detector.hang import HangDetector
from resurge_detector.process_exit import ProcessExitDetector
from resurge_detector.runtime import DetectorRuntime, Partition

SOURCE = Source(service="detector", instance="t")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(generation: int) -> JobRecord:
    job = job_factory.job("j", nproc=2, monitoring={"startupTimeoutSeconds": 5}, preload=None)
    return JobRecord(
        name="j",
        spec=job,
        phase=JobPhase.RUNNING,
        generation=generation,
        placements=[Placement(replica=0, node="n0")],
    )


def exited(local_rank: int, generation: int) -> ProcessExited:
    return ProcessExited(
        source=SOURCE,
        job="j",
        replica=0,
        node="n0",
        generation=generation,
        rank=local_rank,
        pid=100 + local_rank,
        local_rank=local_rank,
        local_world_size=2,
        exit_code=0,
    )


def started(local_rank: int, generation: int) -> ProcessStarted:
    return ProcessStarted(
        source=SOURCE,
        job="j",
        replica=0,
        node="n0",
        generation=generation,
        rank=local_rank,
        pid=100 + local_rank,
        local_rank=local_rank,
        local_world_size=2,
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_new_run_s_success_exits_count_from_its_generation_0() -> None:
    runtime = DetectorRuntime([ProcessExitDetector()], SOURCE, Partition())
    runtime.set_job("j", record(5))
    assert runtime.observe(exited(0, 5), at(0)) == []  # one of two: not finished
    runtime.set_job("j", None)  # deleted
    runtime.set_job("j", record(0))  # submitted again: a new run, a new uid
    assert runtime.observe(exited(0, 0), at(1)) == []
    [finished] = runtime.observe(exited(1, 0), at(2))
    assert isinstance(finished, ReplicaFinished) and finished.generation == 0
    # The old run's entry was deleted from the durable state, not kept for a restart.
    assert all(v is None or b'"generation": 0' in v for v in runtime.state_changes().values())


def test_a_restarted_detector_does_not_count_the_old_run_s_stored_exits_for_the_new_one() -> None:
    old = DetectorRuntime([ProcessExitDetector()], SOURCE, Partition())
    old.set_job("j", record(5))
    old.observe(exited(0, 5), at(0))
    stored = old.state_changes()
    # The detector was down while the job was deleted and submitted again.
    runtime = DetectorRuntime([ProcessExitDetector()], SOURCE, Partition())
    for (detector, job, key), value in stored.items():
        assert value is not None
        runtime.restore_state(detector, job, key, value)
    runtime.set_job("j", record(0))
    runtime.observe(exited(0, 0), at(1))
    [finished] = runtime.observe(exited(1, 0), at(2))
    assert isinstance(finished, ReplicaFinished) and finished.generation == 0


def test_a_new_run_s_generation_0_is_judged_for_hangs() -> None:
    runtime = DetectorRuntime([HangDetector()], SOURCE, Partition())
    runtime.set_job("j", record(5))
    runtime.observe(started(0, 5), at(0))
    runtime.set_job("j", None)
    runtime.set_job("j", record(0))
    runtime.observe(started(0, 0), at(100))
    runtime.observe(started(1, 0), at(100))
    faults = [f for f in runtime.tick(at(200)) if isinstance(f, FaultDetected)]
    assert [(f.reason, f.generation) for f in faults] == [("hang", 0)]
