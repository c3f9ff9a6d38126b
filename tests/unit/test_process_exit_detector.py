from datetime import UTC, datetime

from resurge.control.state.records import JobRecord, Placement
from resurge.control.views.event_words import event_line
from resurge.detection import DetectorContext
from resurge.events import (
    FaultDetected,
    JobPhase,
    ProcessExited,
    RecoveryLevel,
    ReplicaFinished,
    Source,
)
from resurge.local import job_factory
from resurge_detector.process_exit import ProcessExitDetector

SOURCE = Source(service="detector", instance="here:1")


def record(generation: int, phase: JobPhase = JobPhase.RUNNING) -> JobRecord:
    spec = job_factory.job("j", nproc=2, preload=None)
    return JobRecord(
        name="j",
        spec=spec,
        phase=phase,
        generation=generation,
        placements=[Placement(replica=0, node="n")],
    )


def ctx(job: JobRecord) -> DetectorContext:
    return DetectorContext(now=datetime(2026, 1, 1, tzinfo=UTC), source=SOURCE, jobs={"j": job})


def exited(
    local_rank: int,
    code: int | None,
    generation: int = 0,
    *,
    replica: int = 0,
    signal: str | None = None,
    expected: bool = False,
    size: int = 2,
) -> ProcessExited:
    return ProcessExited(
        source=SOURCE,
        job="j",
        replica=replica,
        node="n",
        generation=generation,
        rank=replica * size + local_rank,
        pid=100 + local_rank,
        local_rank=local_rank,
        local_world_size=size,
        exit_code=code,
        signal=signal,
        expected=expected,
    )


def test_nonzero_exit_is_a_process_fault() -> None:
    out = ProcessExitDetector(SOURCE).observe(exited(1, 3))
    assert len(out) == 1 and isinstance(out[0], FaultDetected)
    fault = out[0]
    assert fault.reason == "process_crash" and fault.rank == 1
    assert fault.suggested_level is RecoveryLevel.PROCESS
    assert fault.evidence["exit_code"] == 3


def test_signal_is_a_kill_and_expected_stops_are_not_faults() -> None:
    detector = ProcessExitDetector(SOURCE)
    [fault] = detector.observe(exited(0, None, signal="SIGKILL"))
    assert isinstance(fault, FaultDetected) and fault.reason == "process_killed"
    assert detector.observe(exited(1, None, signal="SIGTERM", expected=True)) == []


def test_replica_finishes_when_every_worker_exits_zero_once() -> None:
    detector = ProcessExitDetector(SOURCE)
    first = exited(0, 0)
    assert detector.observe(first) == []
    assert detector.observe(first) == []  # a redelivery counts once
    [done] = detector.observe(exited(1, 0))
    assert isinstance(done, ReplicaFinished) and done.generation == 0


def test_same_input_gives_same_output_id() -> None:
    event = exited(1, 1)
    assert ProcessExitDetector(SOURCE).observe(event)[0].id == (
        ProcessExitDetector(SOURCE).observe(event)[0].id
    )


def test_older_generation_success_does_not_finish_a_newer_one() -> None:
    detector = ProcessExitDetector(SOURCE)
    assert detector.observe(exited(0, 0, generation=1)) == []
    assert detector.observe(exited(1, 0, generation=0)) == []
    [done] = detector.observe(exited(1, 0, generation=1))
    assert done.generation == 1


def test_a_restarted_detector_given_the_stored_state_still_finishes_the_replica() -> None:
    before = ProcessExitDetector(SOURCE)
    assert before.observe(exited(0, 0, generation=2)) == []
    stored = dict(before.state_changes())
    assert list(stored) == [("j", "r0")] and stored[("j", "r0")] is not None
    assert before.state_changes() == {}  # only what changed since the last call
    after = ProcessExitDetector(SOURCE)  # the service restarted: its memory is gone
    for (job, key), value in stored.items():
        assert value is not None
        after.restore_state(job, key, value)
    [done] = after.observe(exited(1, 0, generation=2))
    assert isinstance(done, ReplicaFinished) and (done.replica, done.generation) == (0, 2)
    assert after.state_changes() == {("j", "r0"): None}  # finished: the entry is deleted


def test_a_redelivered_finishing_exit_concludes_again_with_the_same_id() -> None:
    detector = ProcessExitDetector(SOURCE)
    detector.observe(exited(0, 0))
    last = exited(1, 0)
    [first] = detector.observe(last)
    [again] = detector.observe(last)  # e.g. publishing it failed and the batch came again
    assert first.id == again.id
    assert detector.observe(exited(1, 0)) == []  # another event of an exit already counted


def test_state_of_a_finished_job_or_an_older_generation_is_dropped() -> None:
    detector = ProcessExitDetector(SOURCE)
    running = record(generation=1)
    assert detector.observe(exited(0, 0, generation=0), ctx(running)) == []  # older: ignored
    assert detector.state_changes() == {}
    detector.observe(exited(0, 0, generation=1), ctx(running))
    assert detector.state_changes() != {}
    detector.tick(ctx(running))
    assert detector.state_changes() == {}
    over = record(generation=1, phase=JobPhase.FAILED)
    detector.tick(ctx(over))
    assert detector.state_changes() == {("j", "r0"): None}


def test_a_crash_fault_carries_the_workers_last_output() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "/app/train.py", line 3, in <module>',
        "ValueError: no data in /data/shard-7",
    ]
    event = exited(1, 1).model_copy(update={"last_output": lines})
    (fault,) = ProcessExitDetector().observe(event, ctx(record(0)))
    assert isinstance(fault, FaultDetected)
    assert fault.evidence["last_output"] == "\n".join(lines)
    assert fault.message.endswith(
        "exit code 1; its last output: ValueError: no data in /data/shard-7"
    )
    (quiet,) = ProcessExitDetector().observe(exited(1, 1), ctx(record(0)))
    assert isinstance(quiet, FaultDetected) and "last_output" not in quiet.evidence
    assert quiet.message.endswith("exit code 1")


def test_events_show_the_last_line_in_one_line_and_every_line_in_json() -> None:
    lines = ["Traceback (most recent call last):", "python: can't open file 'nosuch_train.py'"]
    event = exited(1, 2).model_copy(update={"last_output": lines})
    (fault,) = ProcessExitDetector().observe(event, ctx(record(0)))
    assert isinstance(fault, FaultDetected)
    shown: ProcessExited | FaultDetected
    for shown in (event, fault):
        line = event_line(shown)
        assert line is not None and line.endswith("python: can't open file 'nosuch_train.py'")
        assert "Traceback" not in line
        assert "Traceback (most recent call last):" in str(event_line(shown, as_json=True))
