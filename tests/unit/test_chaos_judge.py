"""The control-plane chaos bench's judge (bench/chaos_invariants.py) on made-up moments:
each invariant breaks where it should, once, and not inside the graces it names (a
bench that cannot report a broken invariant would show zero for nothing)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from resurge.control.state.records import JobRecord, Placement
from resurge.events import JobPhase, RecoveryLevel, RecoveryStarted
from resurge.events.envelope import Source
from resurge.local.job_factory import job

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _invariants() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos_invariants", BENCH / "chaos_invariants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos_invariants"] = module
    spec.loader.exec_module(module)
    return module


inv = _invariants()
SLOTS = {"node-0": 2, "node-1": 2}


def record(name: str, phase: JobPhase, nodes: list[str], generation: int = 0) -> JobRecord:
    placements = [Placement(replica=i, node=node) for i, node in enumerate(nodes)]
    return JobRecord(
        name=name, spec=job(name), phase=phase, placements=placements, generation=generation
    )


def started(job_name: str, fault: str, generation: int, event_id: str) -> RecoveryStarted:
    return RecoveryStarted(
        id=event_id, source=Source.here("restarter"), job=job_name, fault_id=fault,
        level=RecoveryLevel.PROCESS,
        reason="crash", from_generation=generation, to_generation=generation + 1,
    )  # fmt: skip


def test_records_placing_more_workers_than_slots_break_at_once() -> None:
    judge = inv.Judge()
    a = record("a", JobPhase.RUNNING, ["node-0", "node-0"])
    b = record("b", JobPhase.RUNNING, ["node-0"])
    judge.sample(1.0, [a, b], [], SLOTS)
    judge.sample(1.5, [a, b], [], SLOTS)
    assert [x.invariant for x in judge.broken] == ["slots"], "once per episode"
    assert "3 workers on node-0" in judge.broken[0].detail


def test_processes_over_slots_break_only_past_the_overlap_grace() -> None:
    judge = inv.Judge()
    workers = [inv.Worker(pid, "a", "node-1", "S", 1) for pid in (10, 11, 12)]
    running = [record("a", JobPhase.RUNNING, ["node-1"])]
    judge.sample(0.0, running, workers, SLOTS)
    judge.sample(inv.OVERLAP_GRACE_SECONDS, running, workers, SLOTS)
    assert judge.broken == [], "a successor starting while the old worker stops"
    judge.sample(inv.OVERLAP_GRACE_SECONDS + 1, running, workers, SLOTS)
    assert [x.invariant for x in judge.broken] == ["slots"]


def test_a_fault_recovered_twice_breaks_and_a_retried_publish_does_not() -> None:
    judge = inv.Judge()
    judge.inject("kill_rank", "a", 1.0)
    judge.recovery(2.0, started("a", "f1", 3, "e1"))
    judge.recovery(2.1, started("a", "f1", 3, "e1"))  # the same event again
    assert judge.broken == [] and judge.injected[0].recovered
    judge.recovery(3.0, started("a", "f1", 3, "e2"))
    assert [x.invariant for x in judge.broken] == ["recovered once"] * 2  # fault, generation


def test_an_injected_fault_without_recovery_breaks_past_the_limit() -> None:
    judge = inv.Judge()
    judge.inject("stop_rank", "a", 0.0)
    running = [record("a", JobPhase.RUNNING, ["node-0"])]
    judge.sample(inv.RECOVERY_LIMIT_SECONDS, running, [], SLOTS)
    assert judge.broken == []
    judge.sample(inv.RECOVERY_LIMIT_SECONDS + 1, running, [], SLOTS)
    assert "no recovery" in judge.broken[0].detail


def test_recovering_past_the_jobs_limit_breaks() -> None:
    judge = inv.Judge()
    stuck = record("a", JobPhase.RECOVERING, ["node-0"])
    limit = inv.recovering_limit(stuck)
    judge.sample(0.0, [stuck], [], SLOTS)
    judge.sample(limit, [stuck], [], SLOTS)
    assert judge.broken == []
    judge.sample(limit + 1, [stuck], [], SLOTS)
    assert [x.invariant for x in judge.broken] == ["Recovering"]


def test_a_worker_of_a_finished_or_deleted_job_breaks_past_the_grace() -> None:
    judge = inv.Judge()
    done = record("a", JobPhase.SUCCEEDED, [])
    left = [inv.Worker(10, "a", "node-0", "S", 1), inv.Worker(11, "gone", "node-1", "S", 1)]
    judge.sample(0.0, [done], left, SLOTS)
    judge.sample(inv.FINISHED_GRACE_SECONDS, [done], left, SLOTS)
    assert judge.broken == []
    judge.sample(inv.FINISHED_GRACE_SECONDS + 1, [done], left, SLOTS)
    assert sorted(x.detail.split()[0] for x in judge.broken) == ["a", "gone"]


def test_a_record_missed_once_does_not_start_the_finished_clock_for_good() -> None:
    judge = inv.Judge()
    running = [record("a", JobPhase.RUNNING, ["node-0"])]
    workers = [inv.Worker(10, "a", "node-0", "S", 1)]
    judge.sample(0.0, [], workers, SLOTS)  # the record was not read this once
    judge.sample(1.0, running, workers, SLOTS)
    judge.sample(inv.FINISHED_GRACE_SECONDS + 2, running, workers, SLOTS)
    assert judge.broken == []
