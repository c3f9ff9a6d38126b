"""The hang, straggler and node-health detectors and the runtime's partitioning (pure)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

from resurge.control.state.records import JobRecord, Placement
from resurge.detection import DetectorContext
from resurge.events import (
    CapacityChanged,
    FaultDetected,
    JobPhase,
    NodeReport,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    Progress,
    Source,
)
from resurge.jobspec.monitoring import (
    LEARNED_HEARTBEAT_FLOOR_SECONDS,
    LEARNED_STARTUP_FLOOR_SECONDS,
    LEARNED_TIMEOUT_FACTOR,
    STOPPED_RANK_SECONDS,
)
from resurge.local import job_factory
from resurge_detector.hang import HangDetector
from resurge_detector.node_health import NodeHealthDetector
from resurge_detector.runtime import DetectorRuntime, Partition
from resurge_detector.straggler import StragglerDetector

SOURCE = Source(service="detector", instance="t")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(name: str = "j", monitoring: dict[str, Any] | None = None) -> JobRecord:
    job = job_factory.job(name, nproc=2, monitoring=monitoring, preload=None)
    return JobRecord(
        name=name,
        spec=job,
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=0, node="n0"), Placement(replica=1, node="n1")],
    )


def ctx(at: float, *records: JobRecord) -> DetectorContext:
    return DetectorContext(
        now=T0 + timedelta(seconds=at), source=SOURCE, jobs={r.name: r for r in records}
    )


def started(rank: int, generation: int = 0) -> ProcessStarted:
    return ProcessStarted(
        source=SOURCE,
        job="j",
        generation=generation,
        rank=rank,
        replica=0,
        node="n0",
        pid=1,
        local_rank=rank,
        local_world_size=2,
    )


def progress(rank: int, step: int, at: float = 0.0, **metrics: float) -> Progress:
    return Progress(
        source=SOURCE,
        job="j",
        generation=0,
        rank=rank,
        replica=rank // 2,
        node=f"n{rank // 2}",
        local_rank=rank % 2,
        step=step,
        metrics=metrics,
        time=T0 + timedelta(seconds=at),
    )


def judge(hang: HangDetector, at: DetectorContext) -> list[FaultDetected]:
    out = hang.tick(at)
    assert all(isinstance(event, FaultDetected) for event in out)
    return [event for event in out if isinstance(event, FaultDetected)]


def stopped(rank: int, is_stopped: bool = True, generation: int = 0) -> ProcessStateChanged:
    return ProcessStateChanged(
        source=SOURCE,
        job="j",
        generation=generation,
        rank=rank,
        replica=rank // 2,
        node=f"n{rank // 2}",
        pid=10 + rank,
        local_rank=rank % 2,
        stopped=is_stopped,
        since=T0,
    )


def progress_at(rank: int, step: int, generation: int = 0) -> Progress:
    return Progress(
        source=SOURCE,
        job="j",
        generation=generation,
        rank=rank,
        replica=rank // 2,
        node=f"n{rank // 2}",
        local_rank=rank % 2,
        step=step,
    )


def train(
    hang: HangDetector,
    rec: JobRecord,
    ranks: range,
    steps: range,
    every: float,
    generation: int = 0,
) -> float:
    """Every rank reports each step, ``every`` seconds apart (detector clock); the last time."""
    at = 0.0
    for step in steps:
        at = step * every
        for rank in ranks:
            hang.observe(progress_at(rank, step, generation), ctx(at, rec))
    return at


def test_explicit_startup_and_heartbeat_timeouts_blame_one_rank_per_generation() -> None:
    rec = record(monitoring={"startupTimeoutSeconds": 5, "heartbeatTimeoutSeconds": 2})
    hang = HangDetector()
    hang.observe(started(0), ctx(0, rec))
    hang.observe(started(1), ctx(0, rec))
    hang.observe(progress(1, 1), ctx(1, rec))
    assert judge(hang, ctx(2.9, rec)) == []
    [late] = judge(hang, ctx(3.1, rec))  # rank 1: 2.1 s since its progress; rank 0 never reported
    assert isinstance(late, FaultDetected) and late.rank == 1
    assert late.fault_id == "hang:j:g0:r1" and late.evidence["blamed"] == "least_progress"
    assert late.evidence["timeout"] == "heartbeat" and late.evidence["last_step"] == 1
    assert late.evidence["limit_source"] == "explicit"
    assert judge(hang, ctx(5.1, rec)) == []  # rank 0's start-up timeout: the same incident
    assert judge(hang, ctx(30, rec)) == []


def test_the_rank_with_the_least_progress_is_blamed_not_the_peers_waiting_on_it() -> None:
    rec = record(monitoring={"heartbeatTimeoutSeconds": 2})
    hang = HangDetector()
    train(hang, rec, range(4), range(1, 10), 0.1)  # steps 1..9, last at 0.9 s
    hang.observe(progress_at(0, 10), ctx(1.0, rec))  # ranks 0, 1 and 3 finished step 10,
    hang.observe(progress_at(1, 10), ctx(1.0, rec))  # then wait on rank 2 in step 11
    hang.observe(progress_at(3, 10), ctx(1.05, rec))
    assert judge(hang, ctx(2.9, rec)) == []
    [fault] = judge(hang, ctx(3.01, rec))  # ranks 0, 1 and 2 are overdue; 3 almost
    assert fault.rank == 2 and fault.evidence["last_step"] == 9
    assert fault.evidence["blamed"] == "least_progress"
    assert fault.evidence["overdue_ranks"] == "0,1,2"
    assert judge(hang, ctx(10, rec)) == []  # one hang fault per job and generation


def test_equal_steps_blame_the_oldest_report() -> None:
    rec = record(monitoring={"heartbeatTimeoutSeconds": 1})
    hang = HangDetector()
    for rank, at in ((0, 0.3), (1, 0.1), (2, 0.2)):
        hang.observe(progress_at(rank, 5), ctx(at, rec))
    [fault] = judge(hang, ctx(1.35, rec))
    assert fault.rank == 1


def test_a_stopped_rank_is_blamed_within_the_short_bound_under_default_monitoring() -> None:
    rec = record()  # no timeouts set: the defaults
    hang = HangDetector()
    for rank in range(4):
        hang.observe(started(rank), ctx(0, rec))
    last = train(hang, rec, range(4), range(1, 40), 0.05)
    hang.observe(stopped(1), ctx(last + 0.1, rec))  # its peers now wait in an all-reduce
    assert judge(hang, ctx(last + 0.1 + STOPPED_RANK_SECONDS - 0.05, rec)) == []
    [fault] = judge(hang, ctx(last + 0.1 + STOPPED_RANK_SECONDS + 0.05, rec))
    assert (fault.reason, fault.rank, fault.generation) == ("hang", 1, 0)
    assert fault.fault_id == "hang:j:g0:r1" and fault.replica == 0 and fault.node == "n0"
    assert fault.evidence["blamed"] == "stopped" and fault.evidence["timeout"] == "stopped"
    assert fault.evidence["stopped"] is True
    assert fault.id == "hang-" + hashlib.sha256(b"hang:j:g0:r1").hexdigest()[:40]  # redelivery


def test_a_stopped_rank_whose_job_still_progresses_or_that_ran_again_is_not_a_hang_yet() -> None:
    rec = record()
    hang = HangDetector()
    last = train(hang, rec, range(2), range(1, 20), 0.1)
    hang.observe(stopped(1), ctx(last, rec))
    for step in range(20, 60):  # rank 0 does not depend on rank 1 here, and goes on
        hang.observe(progress_at(0, step), ctx(last + (step - 19) * 0.1, rec))
    assert judge(hang, ctx(last + 4.05, rec)) == []
    assert judge(hang, ctx(last + 4.0 + STOPPED_RANK_SECONDS + 0.1, rec))[0].rank == 1
    again = HangDetector()
    last = train(again, rec, range(2), range(1, 20), 0.1)
    again.observe(stopped(1), ctx(last, rec))
    again.observe(stopped(1, False), ctx(last + 1, rec))  # a debugger let it go on
    assert judge(again, ctx(last + 10, rec)) == []


def test_stopped_rank_blamed_even_when_an_explicit_timeout_trips_its_peers_first() -> None:
    rec = record(monitoring={"heartbeatTimeoutSeconds": 0.5})
    hang = HangDetector()
    last = train(hang, rec, range(4), range(1, 10), 0.1)
    hang.observe(progress_at(0, 10), ctx(last + 0.1, rec))  # rank 0 reports one step more
    hang.observe(stopped(3), ctx(last + 0.05, rec))
    [fault] = judge(hang, ctx(last + 0.1 + STOPPED_RANK_SECONDS + 0.01, rec))
    assert fault.rank == 3 and fault.evidence["blamed"] == "stopped"


def test_the_learned_heartbeat_timeout_follows_the_longest_gap_with_a_floor() -> None:
    rec = record()
    hang = HangDetector()
    last = train(hang, rec, range(2), range(1, 5), 1.0)  # 1 s steps: the floor applies
    floor = LEARNED_HEARTBEAT_FLOOR_SECONDS
    assert judge(hang, ctx(last + floor - 1, rec)) == []
    [fault] = judge(hang, ctx(last + floor + 1, rec))
    assert fault.evidence["limit_source"] == "learned"
    assert fault.evidence["limit_seconds"] == floor
    slow = HangDetector()  # steps of 200 s: 5 x 200 s = 1000 s
    last = train(slow, rec, range(2), range(1, 4), 200.0)
    assert judge(slow, ctx(last + 999, rec)) == []
    [fault] = judge(slow, ctx(last + 1001, rec))
    assert fault.evidence["limit_seconds"] == LEARNED_TIMEOUT_FACTOR * 200


def test_scripts_without_progress_are_judged_only_when_stopped_and_zero_turns_hangs_off() -> None:
    hang = HangDetector()
    for rank in range(2):
        hang.observe(started(rank), ctx(0, record()))
    assert judge(hang, ctx(100_000, record())) == []  # silent is not hung: no heartbeat
    hang.observe(stopped(1), ctx(100_001, record()))
    assert judge(hang, ctx(100_002, record())) == []
    [fault] = judge(hang, ctx(100_001 + STOPPED_RANK_SECONDS, record()))
    assert fault.rank == 1 and fault.evidence["blamed"] == "stopped"
    off = record(monitoring={"heartbeatTimeoutSeconds": 0, "startupTimeoutSeconds": 0})
    hang = HangDetector()
    last = train(hang, off, range(2), range(1, 5), 0.1)
    hang.observe(stopped(1), ctx(last, off))
    assert judge(hang, ctx(100_000, off)) == []


def test_later_generations_get_a_learned_startup_limit_for_ranks_that_reported() -> None:
    rec = record()
    hang = HangDetector()
    hang.observe(started(0), ctx(0, rec))
    hang.observe(started(1), ctx(0, rec))
    hang.observe(progress_at(0, 1), ctx(300, rec))  # only rank 0 reports progress; 300 s start-up
    assert judge(hang, ctx(100_000, rec)) != []  # generation 0: rank 0's learned heartbeat
    rec.generation = 1
    hang.observe(started(0, generation=1), ctx(100_000, rec))
    hang.observe(started(1, generation=1), ctx(100_000, rec))
    limit = LEARNED_TIMEOUT_FACTOR * 300
    assert limit > LEARNED_STARTUP_FLOOR_SECONDS
    assert judge(hang, ctx(100_000 + limit - 1, rec)) == []
    [fault] = judge(hang, ctx(100_000 + limit + 1, rec))
    assert (fault.rank, fault.generation, fault.evidence["timeout"]) == (0, 1, "startup")
    assert fault.evidence["limit_source"] == "learned"


def test_exited_ranks_and_old_generations_are_not_hangs() -> None:
    rec = record(monitoring={"heartbeatTimeoutSeconds": 1, "startupTimeoutSeconds": 1})
    hang = HangDetector()
    hang.observe(started(1), ctx(0, rec))
    hang.observe(
        ProcessExited(
            source=SOURCE,
            job="j",
            generation=0,
            rank=1,
            pid=1,
            local_rank=1,
            local_world_size=2,
            exit_code=0,
        ),
        ctx(0.5, rec),
    )
    assert judge(hang, ctx(10, rec)) == []
    hang.observe(started(0), ctx(10, rec))
    rec.generation = 1
    assert judge(hang, ctx(20, rec)) == []


def test_straggler_needs_consecutive_slow_windows_and_reports_evidence() -> None:
    rec = record(
        monitoring={
            "straggler": {
                "enabled": True,
                "windowSteps": 3,
                "slowFactor": 1.5,
                "minSteps": 2,
                "consecutiveWindows": 2,
            }
        }
    )
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
        event = NodeReport(
            source=SOURCE, node="n1", slots_total=2, slots_free=free, healthy=healthy
        )
        return nodes.observe(event, ctx(at, rec))

    [first] = report(0, 2)
    assert isinstance(first, CapacityChanged) and first.slots_free == 2 and first.healthy
    assert report(1, 2) == []  # nothing changed
    [busy] = report(2, 0)
    assert busy.slots_free == 0
    capacity, fault = nodes.tick(ctx(8, rec))
    assert isinstance(capacity, CapacityChanged) and not capacity.healthy
    assert isinstance(fault, FaultDetected) and fault.reason == "node_lost" and fault.replica == 1
    # n0 holds replica 0 and was never heard since the first tick (8 s): lost as well,
    # with no capacity (its slots were never seen).
    [placed] = nodes.tick(ctx(20, rec))
    assert isinstance(placed, FaultDetected) and (placed.reason, placed.node) == ("node_lost", "n0")
    assert nodes.tick(ctx(30, rec)) == []
    [back] = report(31, 2)
    assert back.healthy
    capacity, unhealthy = report(32, 2, healthy=False)
    assert unhealthy.reason == "node_unhealthy" and unhealthy.fault_id != fault.fault_id


def test_partitions_split_jobs_between_replicas_exactly_once() -> None:
    names = [f"job-{i}" for i in range(200)]
    owners = [
        [p.owns(n) for p in (Partition(3, 0), Partition(3, 1), Partition(3, 2))] for n in names
    ]
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
