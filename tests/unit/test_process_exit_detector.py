from resurge.events import FaultDetected, ProcessExited, RecoveryLevel, ReplicaFinished, Source
from resurge_detector.process_exit import ProcessExitDetector

SOURCE = Source(service="detector", instance="here:1")


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
