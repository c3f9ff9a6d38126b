"""The recovery ladder and the record changes of each decision: pure functions, no I/O."""

from datetime import UTC, datetime, timedelta
from typing import Any

from resurge.cluster import NodeInfo
from resurge.events import FaultDetected, FaultScope, JobPhase, RecoveryLevel, Source
from resurge.jobspec import parse_job
from resurge.records import JobRecord, Placement, RestartEntry
from resurge_restarter.policy import (
    ClusterView,
    Verdict,
    apply_checkpoint,
    apply_fault,
    apply_sign_of_life,
    backoff_seconds,
    claim,
    mark_dispatched,
)

SOURCE = Source(service="detector", instance="here:1")
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def record(max_restarts: int = 5, replicas: int = 2, **recovery: Any) -> JobRecord:
    job = parse_job(
        {
            "metadata": {"name": "j"},
            "spec": {
                "command": ["x"],
                "nprocPerNode": 2,
                "replicas": {"min": replicas},
                "recovery": {"jobMaxRetryCount": max_restarts, **recovery},
            },
        }
    )
    return JobRecord(
        name="j",
        spec=job,
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=r, node=f"n{r}") for r in range(replicas)],
    )


def fault(
    fault_id: str,
    generation: int,
    *,
    rank: int | None = 1,
    replica: int | None = 0,
    scope: FaultScope = FaultScope.PROCESS,
    reason: str = "process_crash",
    node: str | None = None,
    suggested: RecoveryLevel | None = RecoveryLevel.PROCESS,
) -> FaultDetected:
    return FaultDetected(
        source=SOURCE,
        job="j",
        generation=generation,
        rank=rank,
        replica=replica,
        node=node,
        fault_id=fault_id,
        scope=scope,
        reason=reason,
        suggested_level=suggested,
        time=T0,
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_fault_starts_next_generation_at_process_level() -> None:
    rec = record()
    decision = apply_fault(rec, fault("a", 0), now=at(0), claimant="me")
    assert decision.verdict is Verdict.RESTART and decision.level is RecoveryLevel.PROCESS
    assert rec.generation == 1 and rec.phase is JobPhase.RECOVERING
    assert rec.restarts == {RecoveryLevel.PROCESS: 1}
    plan = rec.pending_recovery
    assert plan is not None and plan.to_generation == 1 and plan.from_generation == 0
    assert plan.claimed_by == "me" and not plan.dispatched
    assert plan.start_at == at(0)  # the first restart goes at once
    assert [p.node for p in plan.stop_placements] == ["n0", "n1"]


def test_repeat_and_stale_faults_change_nothing() -> None:
    rec = record()
    apply_fault(rec, fault("a", 0), now=at(0))
    snapshot = rec.model_copy(deep=True)
    assert apply_fault(rec, fault("a", 0), now=at(1)).verdict is Verdict.IGNORE
    assert apply_fault(rec, fault("b", 0), now=at(1)).verdict is Verdict.IGNORE  # a peer's
    assert rec == snapshot


def test_a_rank_that_crashes_every_time_climbs_process_pod_job_then_fails() -> None:
    rec = record(max_restarts=10, maxFullJobRestarts=1)
    levels = []
    for generation in range(3):
        decision = apply_fault(rec, fault(f"f{generation}", generation), now=at(generation))
        levels.append(decision.level)
    assert levels == [RecoveryLevel.PROCESS, RecoveryLevel.POD, RecoveryLevel.JOB]
    assert rec.incarnations == {0: 2, 1: 1}  # pod: the faulty replica; job: every replica
    assert rec.avoid_nodes == [] and rec.pending_recovery is not None
    assert rec.pending_recovery.cordon == []  # a crashing process never cordons a node
    decision = apply_fault(rec, fault("f3", 3), now=at(3))
    assert decision.verdict is Verdict.FAIL and rec.phase is JobPhase.FAILED
    assert "maxFullJobRestarts=1" in rec.message and "process_crash (f3)" in rec.message


def test_the_same_fault_is_the_same_reason_whichever_rank_reported_it() -> None:
    rec = record()
    first = apply_fault(rec, fault("a", 0, rank=1), now=at(0))
    second = apply_fault(rec, fault("b", 1, rank=2), now=at(1))
    assert (first.level, second.level) == (RecoveryLevel.PROCESS, RecoveryLevel.POD)
    third = apply_fault(rec, fault("c", 2, reason="hang"), now=at(2))
    assert third.level is RecoveryLevel.PROCESS  # another reason: not the same fault


def test_a_repeat_outside_the_eval_period_starts_low_again() -> None:
    rec = record(evalPeriodSeconds=60)
    apply_fault(rec, fault("a", 0), now=at(0))
    decision = apply_fault(rec, fault("b", 1), now=at(61))
    assert decision.level is RecoveryLevel.PROCESS
    assert len(rec.history) == 1  # the old entry left the window


def test_past_the_top_listed_level_the_top_level_repeats_until_limits() -> None:
    rec = record(max_restarts=3, levels=["process"])
    levels = [apply_fault(rec, fault(f"f{g}", g), now=at(g)).level for g in range(3)]
    assert levels == [RecoveryLevel.PROCESS] * 3
    decision = apply_fault(rec, fault("f3", 3), now=at(3))
    assert decision.verdict is Verdict.FAIL and "jobMaxRetryCount=3" in rec.message


def test_per_level_limit_passes_to_the_next_level_and_fails_at_the_top() -> None:
    rec = record(levels=["process", "job"], maxRestartsPerLevel={"process": 1, "job": 1})
    a = apply_fault(rec, fault("a", 0, reason="r1"), now=at(0))
    b = apply_fault(rec, fault("b", 1, reason="r2"), now=at(1))
    assert (a.level, b.level) == (RecoveryLevel.PROCESS, RecoveryLevel.JOB)
    c = apply_fault(rec, fault("c", 2, reason="r3"), now=at(2))
    assert c.verdict is Verdict.FAIL and "maxRestartsPerLevel.job=1" in rec.message


def test_num_restart_before_full_job_restart() -> None:
    rec = record(numRestartBeforeFullJobRestart=2)
    levels = [
        apply_fault(rec, fault(f"f{g}", g, reason=f"r{g}"), now=at(g)).level for g in range(3)
    ]
    assert levels == [RecoveryLevel.PROCESS, RecoveryLevel.PROCESS, RecoveryLevel.JOB]


def test_in_process_only_for_capable_workers_and_allowed_levels() -> None:
    wants = RecoveryLevel.IN_PROCESS
    rec = record()
    assert apply_fault(rec, fault("a", 0, suggested=wants), now=at(0)).level is (
        RecoveryLevel.PROCESS
    )
    rec = record()
    rec.in_process_capable = True
    decision = apply_fault(rec, fault("a", 0, suggested=wants), now=at(0))
    assert decision.level is RecoveryLevel.IN_PROCESS
    assert rec.pending_recovery is not None and rec.incarnations == {}
    repeat = apply_fault(rec, fault("b", 1, suggested=wants), now=at(1))
    assert repeat.level is RecoveryLevel.PROCESS  # the same fault again: one rung up
    rec = record(levels=["process", "job"])
    rec.in_process_capable = True
    assert apply_fault(rec, fault("a", 0, suggested=wants), now=at(0)).level is (
        RecoveryLevel.PROCESS
    )


def xid(fault_id: str, generation: int, node: str = "n0") -> FaultDetected:
    return fault(
        fault_id, generation, rank=None, replica=None, scope=FaultScope.NODE,
        reason="gpu_xid_79", node=node, suggested=RecoveryLevel.NODE,
    )  # fmt: skip


def cluster(*free: tuple[str, int]) -> ClusterView:
    nodes = [NodeInfo(name=name, slots=2, address=f"10.0.0.{i}") for i, (name, _) in
             enumerate(free)]  # fmt: skip
    return ClusterView(nodes=nodes, used={name: 2 - f for name, f in free})


def test_node_fault_cordons_and_moves_the_replica_to_a_spare_first() -> None:
    rec = record()
    rec.spare_nodes = ["n3"]
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2), ("n3", 2))
    decision = apply_fault(rec, xid("x", 0), now=at(0), cluster=view)
    assert decision.level is RecoveryLevel.NODE
    plan = rec.pending_recovery
    assert plan is not None and plan.cordon == ["n0"]
    assert [(m.replica, m.from_node, m.to_node) for m in plan.moves] == [(0, "n0", "n3")]
    assert sorted((p.replica, p.node) for p in rec.placements) == [(0, "n3"), (1, "n1")]
    assert rec.placements[0].address == "10.0.0.3"
    assert rec.spare_nodes == [] and rec.avoid_nodes == ["n0"]


def test_node_fault_without_a_spare_takes_another_free_node() -> None:
    rec = record()
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2))
    apply_fault(rec, xid("x", 0), now=at(0), cluster=view)
    assert rec.pending_recovery is not None
    assert [m.to_node for m in rec.pending_recovery.moves] == ["n2"]


def test_node_fault_with_no_room_requeues_the_job() -> None:
    rec = record()
    decision = apply_fault(rec, xid("x", 0), now=at(0), cluster=cluster(("n0", 0), ("n1", 0)))
    assert decision.verdict is Verdict.RESTART and rec.phase is JobPhase.PENDING
    assert rec.placements == [] and rec.pending_recovery is not None
    assert rec.pending_recovery.requeue and "waiting for capacity" in rec.message


def test_repeat_offender_node_is_avoided_even_for_a_fault_that_suggests_less() -> None:
    rec = record(maxRepeatOffenders=2)
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2))
    slow = fault(
        "s1", 0, rank=None, replica=None, scope=FaultScope.NODE, reason="slow_node",
        node="n0", suggested=RecoveryLevel.PROCESS,
    )  # fmt: skip
    assert apply_fault(rec, slow, now=at(0), cluster=view).level is RecoveryLevel.NODE
    rec = record(maxRepeatOffenders=2)
    rec.history = [
        RestartEntry(time=at(0), level=RecoveryLevel.NODE, signature="x@n0", node="n0",
                     node_scoped=True),
        RestartEntry(time=at(1), level=RecoveryLevel.NODE, signature="y@n0", node="n0",
                     node_scoped=True),
    ]  # fmt: skip
    crash = fault("c", 0, node="n0")
    decision = apply_fault(rec, crash, now=at(2), cluster=view)
    assert decision.level is RecoveryLevel.NODE and rec.avoid_nodes == ["n0"]
    assert rec.pending_recovery is not None and rec.pending_recovery.cordon == []


def test_backoff_first_at_once_then_growing() -> None:
    job = record(backoff={"initialSeconds": 2, "multiplier": 3, "maxSeconds": 10}).spec
    assert [backoff_seconds(job, n) for n in range(5)] == [0.0, 2.0, 6.0, 10.0, 10.0]
    rec = record(backoff={"initialSeconds": 2})
    apply_fault(rec, fault("a", 0, reason="r1"), now=at(0))
    apply_fault(rec, fault("b", 1, reason="r2"), now=at(1))
    assert rec.pending_recovery is not None and rec.pending_recovery.start_at == at(3)


def test_claims_lapse_and_dispatch_is_marked_once() -> None:
    rec = record()
    apply_fault(rec, fault("a", 0), now=at(0), claimant="one", lease_seconds=3)
    assert not claim(rec, "two", at(1), 3)  # still claimed by one
    assert claim(rec, "one", at(1), 3)  # one may always go on
    assert claim(rec, "two", at(5), 3)  # lapsed
    assert rec.pending_recovery is not None and rec.pending_recovery.claimed_by == "two"
    assert not mark_dispatched(rec, 7) and mark_dispatched(rec, 1)
    assert not mark_dispatched(rec, 1) and not claim(rec, "three", at(60), 3)


def test_limit_spent_fails_the_job_naming_fault_and_limit() -> None:
    rec = record(max_restarts=1)
    apply_fault(rec, fault("a", 0), now=at(0))
    decision = apply_fault(rec, fault("b", 1), now=at(1))
    assert decision.verdict is Verdict.FAIL
    assert rec.phase is JobPhase.FAILED
    assert "jobMaxRetryCount=1" in rec.message and "b" in rec.message
    assert apply_fault(rec, fault("c", 1), now=at(2)).verdict is Verdict.IGNORE


def test_first_worker_start_closes_recovery_when_workers_report_no_progress() -> None:
    rec = record()
    bad = fault("a", 0)
    apply_fault(rec, bad, now=at(0))
    assert not apply_sign_of_life(rec, 0, datetime.now(UTC), progress=False)
    assert apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.25), progress=False)
    assert rec.phase is JobPhase.RUNNING and rec.pending_recovery is None
    assert rec.last_recovery_seconds == 0.25
    assert not apply_sign_of_life(rec, 1, bad.time, progress=False)


def test_first_step_closes_recovery_when_workers_report_progress() -> None:
    rec = record()
    assert apply_sign_of_life(rec, 0, datetime.now(UTC), progress=True)  # learns it reports
    assert rec.reports_progress
    bad = fault("a", 0)
    apply_fault(rec, bad, now=at(0))
    assert not apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.1), progress=False)
    assert rec.pending_recovery is not None
    assert apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.5), progress=True)
    assert rec.pending_recovery is None and rec.last_recovery_seconds == 0.5


def test_checkpoint_becomes_resume_point_once_every_rank_saved_it() -> None:
    rec = record(replicas=1)
    rec.spec = rec.spec.model_copy(
        update={"spec": rec.spec.spec.model_copy(update={"nproc_per_node": 1})}
    )
    rec.placements = [Placement(replica=0, node="a"), Placement(replica=1, node="b")]
    assert rec.world_size == 2
    assert apply_checkpoint(rec, 0, 10, "/c/step-10")
    assert not apply_checkpoint(rec, 0, 10, "/c/step-10")  # a repeat changes nothing
    assert rec.latest_checkpoint is None
    assert apply_checkpoint(rec, 0, 20, "/c/step-20")
    assert apply_checkpoint(rec, 1, 10, "/c/step-10")
    assert rec.latest_checkpoint is not None and rec.latest_checkpoint.step == 10
    assert rec.checkpoint_reports == {20: [0]}
    assert not apply_checkpoint(rec, 1, 5, "/c/step-5")  # older than the resume point
    assert apply_checkpoint(rec, 1, 20, "/c/step-20")
    assert rec.latest_checkpoint.step == 20 and rec.checkpoint_reports == {}


def test_alerts_are_not_acted_on() -> None:
    rec = record()
    alert = fault("a", 0).model_copy(update={"alert_only": True})
    assert apply_fault(rec, alert, now=at(0)).verdict is Verdict.IGNORE
    assert rec.generation == 0 and rec.handled_faults == []
