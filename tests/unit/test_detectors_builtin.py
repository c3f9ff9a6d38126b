"""The hang, straggler and node-health detectors and the runtime's partitioning (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from resurge.detection import DetectorContext
from resurge.events import (
    CapacityChanged,
    FaultDetected,
    JobPhase,
    NodeReport,
    ProcessExited,
    ProcessStarted,
    Progress,
    Source,
)
from resurge.jobspec import parse_job
from resurge.records import JobRecord, Placement
from resurge_detector.hang import HangDetector
from resurge_detector.node_health import NodeHealthDetector
from resurge_detector.runtime import DetectorRuntime, Partition
from resurge_detector.straggler import StragglerDetector

SOURCE = Source(service="detector", instance="t")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(name: str = "j", monitoring: dict[str, Any] | None = None) -> JobRecord:
    job = parse_job({"metadata": {"name": name},
                     "spec": {"command": ["x"], "nprocPerNode": 2,
                              "monitoring": monitoring or {}}})  # fmt: skip
    return JobRecord(
        name=name,
        spec=job,
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=0, node="n0"), Placement(replica=1, node="n1")],
    )


def ctx(at: float, *records: JobRecord) -> DetectorContext:
    return DetectorContext(now=T0 + timedelta(seconds=at), source=SOURCE,
                           jobs={r.name: r for r in records})  # fmt: skip


def started(rank: int, generation: int = 0) -> ProcessStarted:
    return ProcessStarted(source=SOURCE, job="j", generation=generation, rank=rank, replica=0,
                          node="n0", pid=1, local_rank=rank, local_world_size=2)  # fmt: skip


def progress(rank: int, step: int, at: float = 0.0, **metrics: float) -> Progress:
    return Progress(source=SOURCE, job="j", generation=0, rank=rank, replica=rank // 2,
                    node=f"n{rank // 2}", local_rank=rank % 2, step=step, metrics=metrics,
                    time=T0 + timedelta(seconds=at))  # fmt: skip


def test_hang_startup_and_heartbeat_timeouts_fire_once() -> None:
    rec = record(monitoring={"startupTimeoutSeconds": 5, "heartbeatTimeoutSeconds": 2})
    hang = HangDetector()
    hang.observe(started(0), ctx(0, rec))
    hang.observe(started(1), ctx(0, rec))
    hang.observe(progress(1, 1), ctx(1, rec))
    assert hang.tick(ctx(2.9, rec)) == []
    [late] = hang.tick(ctx(3.1, rec))  # rank 1: 2.1 s since its progress
    assert isinstance(late, FaultDetected) and late.rank == 1
    assert late.evidence["timeout"] == "heartbeat" and late.evidence["last_step"] == 1
    [startup] = hang.tick(ctx(5.1, rec))  # rank 0 never reported
    assert startup.rank == 0 and startup.evidence["timeout"] == "startup"
    assert hang.tick(ctx(30, rec)) == []


def test_no_timeouts_configured_or_exited_or_old_generation_means_no_hang() -> None:
    hang = HangDetector()
    hang.observe(started(0), ctx(0, record()))
    assert hang.tick(ctx(100, record())) == []
    rec = record(monitoring={"heartbeatTimeoutSeconds": 1, "startupTimeoutSeconds": 1})
    hang.observe(started(1), ctx(0, rec))
    hang.observe(ProcessExited(source=SOURCE, job="j", generation=0, rank=1, pid=1, local_rank=1,
                               local_world_size=2, exit_code=0), ctx(0.5, rec))  # fmt: skip
    rec.generation = 1
    assert hang.tick(ctx(10, rec)) == []


def test_straggler_needs_consecutive_slow_windows_and_reports_evidence() -> None:
    rec = record(monitoring={"straggler": {"enabled": True, "windowSteps": 3, "slowFactor": 1.5,
                                           "minSteps": 2, "consecutiveWindows": 2}})  # fmt: skip
    detector = StragglerDetector()
    out: list[FaultDetected] = []
    for step in range(1, 15):
        for rank in range(4):
            seconds = 0.3 if rank == 3 else 0.1
            out += detector.observe(progress(rank, step, step_seconds=seconds), ctx(step, rec))  # type: ignore[arg-type]
    [fault] = out
    assert fault.rank == 3 and fault.reason == "straggler" and fault.scope.value == "node"
    assert fault.evidence["median_seconds"] == 0.1 and fault.evidence["windows"] == 2
    assert fault.alert_only


def test_straggler_uses_progress_intervals_without_a_step_metric_and_ignores_noise() -> None:
    rec = record(monitoring={"straggler": {"enabled": True, "windowSteps": 4, "minSteps": 1}})
    detector = StragglerDetector()
    out = []
    for step in range(1, 30):
        for rank in range(4):
            jitter = 0.01 * ((step + rank) % 3)  # healthy ranks differ a little
            out += detector.observe(progress(rank, step, at=step * 0.1 + jitter), ctx(step, rec))
    assert out == []


def test_node_health_publishes_capacity_changes_and_faults_jobs_on_a_lost_node() -> None:
    rec = record()
    nodes = NodeHealthDetector(silence_seconds=5)

    def report(at: float, free: int, healthy: bool = True) -> list[Any]:
        event = NodeReport(source=SOURCE, node="n1", slots_total=2, slots_free=free,
                           healthy=healthy)  # fmt: skip
        return nodes.observe(event, ctx(at, rec))

    [first] = report(0, 2)
    assert isinstance(first, CapacityChanged) and first.slots_free == 2 and first.healthy
    assert report(1, 2) == []  # nothing changed
    [busy] = report(2, 0)
    assert busy.slots_free == 0
    capacity, fault = nodes.tick(ctx(8, rec))
    assert isinstance(capacity, CapacityChanged) and not capacity.healthy
    assert isinstance(fault, FaultDetected) and fault.reason == "node_lost" and fault.replica == 1
    assert nodes.tick(ctx(20, rec)) == []
    [back] = report(21, 2)
    assert back.healthy
    capacity, unhealthy = report(22, 2, healthy=False)
    assert unhealthy.reason == "node_unhealthy" and unhealthy.fault_id != fault.fault_id


def test_partitions_split_jobs_between_replicas_exactly_once() -> None:
    names = [f"job-{i}" for i in range(200)]
    owners = [[p.owns(n) for p in (Partition(3, 0), Partition(3, 1), Partition(3, 2))]
              for n in names]  # fmt: skip
    assert all(sum(o) == 1 for o in owners)
    assert all(sum(o[i] for o in owners) > 40 for i in range(3))


def test_runtime_survives_a_broken_detector_and_only_replica_0_publishes_capacity() -> None:
    class Broken:
        name = "broken"
        kinds = frozenset({"node_report"})

        def observe(self, event: Any, ctx: DetectorContext) -> list[Any]:
            raise RuntimeError("bug in a plugin")

        def tick(self, ctx: DetectorContext) -> list[Any]:
            return []

    report = NodeReport(source=SOURCE, node="n1", slots_total=1, slots_free=1, healthy=True)
    zero = DetectorRuntime([Broken(), NodeHealthDetector()], SOURCE, Partition(2, 0))
    one = DetectorRuntime([NodeHealthDetector()], SOURCE, Partition(2, 1))
    assert [e.kind for e in zero.observe(report, T0)] == ["capacity_changed"]
    assert zero.failures["broken"] == 1
    assert one.observe(report, T0) == []
