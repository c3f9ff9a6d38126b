"""The worker_fault detector: a worker's caught exception becomes an in-process fault."""

from __future__ import annotations

from datetime import UTC, datetime

from resurge.detection import DetectorContext, load_detectors
from resurge.events import FaultDetected, FaultScope, RecoveryLevel, Severity, Source, WorkerFault
from resurge_detector.worker_fault import WorkerFaultDetector

SOURCE = Source(service="detector", instance="here:1")


def worker_fault(rank: int = 3, generation: int | None = 2, **fields: object) -> WorkerFault:
    values: dict[str, object] = {
        "source": Source(service="node-agent", instance="n1:7"),
        "job": "j",
        "replica": 1,
        "node": "n1",
        "generation": generation,
        "rank": rank,
        "local_rank": rank - 2,
        "exception": "builtins.ValueError",
        "message": "bad batch",
        "traceback": "Traceback (most recent call last):\n" + "x" * 3000 + "\nValueError",
    }
    values.update(fields)
    return WorkerFault.model_validate(values)


def test_an_exception_is_a_process_fault_suggesting_an_in_process_restart() -> None:
    event = worker_fault()
    [fault] = WorkerFaultDetector(SOURCE).observe(event)
    assert isinstance(fault, FaultDetected)
    assert (fault.job, fault.replica, fault.node, fault.rank, fault.generation) == (
        "j",
        1,
        "n1",
        3,
        2,
    )
    assert fault.scope is FaultScope.PROCESS and fault.severity is Severity.ERROR
    assert fault.reason == "worker_exception"
    assert fault.suggested_level is RecoveryLevel.IN_PROCESS
    assert fault.evidence["exception"] == "builtins.ValueError"
    assert fault.evidence["message"] == "bad batch"
    assert fault.evidence["local_rank"] == 1
    assert fault.evidence["reported_at"] == event.time.isoformat()
    tail = fault.evidence["traceback_tail"]
    assert isinstance(tail, str) and tail.endswith("ValueError") and len(tail) == 1024
    assert "ValueError: bad batch" in fault.message and not fault.alert_only


def test_ids_follow_the_input_so_a_redelivery_is_deduplicated() -> None:
    detector = WorkerFaultDetector(SOURCE)
    event = worker_fault()
    [first] = detector.observe(event)
    [again] = detector.observe(event)
    assert isinstance(first, FaultDetected) and isinstance(again, FaultDetected)
    assert first.id == again.id == f"fault-{event.id}"
    assert first.fault_id == again.fault_id == "worker_fault:j:g2:r3"
    [other] = detector.observe(worker_fault(rank=4))
    assert isinstance(other, FaultDetected)
    assert other.fault_id == "worker_fault:j:g2:r4" and other.id != first.id


def test_an_event_without_job_or_generation_is_no_fault() -> None:
    detector = WorkerFaultDetector(SOURCE)
    assert detector.observe(worker_fault(job=None)) == []
    assert detector.observe(worker_fault(generation=None)) == []


def test_it_signs_with_the_context_source_and_is_registered() -> None:
    ctx = DetectorContext(now=datetime.now(UTC), source=SOURCE)
    [detector] = load_detectors(["worker_fault"])
    [fault] = detector.observe(worker_fault(), ctx)
    assert fault.source == SOURCE
    assert detector.kinds == frozenset({"worker_fault"}) and list(detector.tick(ctx)) == []


def test_a_lost_agent_is_a_fault_about_its_replica_that_asks_for_a_new_agent() -> None:
    from resurge.control.state.records import JobRecord
    from resurge.events import AgentState, AgentStateChanged, JobPhase
    from resurge.local import job_factory
    from resurge_detector.agent_lost import AgentLostDetector

    record = JobRecord(
        name="j",
        spec=job_factory.job("j", nproc=2, replicas=2, preload=None),
        phase=JobPhase.RUNNING,
        generation=4,
    )
    ctx = DetectorContext(now=datetime.now(UTC), source=SOURCE, jobs={"j": record})
    lost = AgentStateChanged(
        source=SOURCE,
        job="j",
        replica=1,
        node="node-1",
        state=AgentState.LOST,
        detail="exited with -9",
    )
    [fault] = AgentLostDetector().observe(lost, ctx)
    assert isinstance(fault, FaultDetected)
    assert (fault.reason, fault.replica, fault.generation) == ("agent_lost", 1, 4)
    assert fault.suggested_level is RecoveryLevel.POD and fault.id == f"fault-{lost.id}"
    running = lost.model_copy(update={"state": AgentState.RUNNING})
    assert AgentLostDetector().observe(running, ctx) == []
    record.phase = JobPhase.SUCCEEDED
    assert AgentLostDetector().observe(lost, ctx) == []
