"""What a job record owes after a decision, in the record itself: a plan that replaces
one not yet carried out takes over what it owed; a failed job's last steps are noted
with its phase, claimed, marked done; the reconciler's next look. Pure functions."""

from datetime import UTC, datetime, timedelta

from resurge.cluster import NodeInfo
from resurge.control.decisions.job_end import begin_ending, claim_ending, mark_ended
from resurge.control.decisions.recovery_policy import (
    ClusterView,
    Verdict,
    apply_fault,
    mark_dispatched,
    same_plan,
    supersede,
)
from resurge.control.state.records import JobRecord, Placement
from resurge.events import FaultDetected, FaultScope, JobPhase, RecoveryLevel, Source
from resurge.local import job_factory
from resurge_restarter.reconcile import ASAP, next_look

SOURCE = Source(service="detector", instance="here:1")
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(**recovery: object) -> JobRecord:
    job = job_factory.job("j", nproc=2, replicas=3, recovery=recovery, preload=None)
    return JobRecord(
        name="j",
        uid="run",
        spec=job,
        phase=JobPhase.RUNNING,
        generation=1,
        placements=[Placement(replica=r, node=f"n{r}") for r in range(3)],
    )


def crash(fault_id: str, generation: int | None = 1) -> FaultDetected:
    return FaultDetected(
        source=SOURCE, job="j", generation=generation, rank=1, replica=0, fault_id=fault_id,
        scope=FaultScope.PROCESS, reason="process_crash",
    )  # fmt: skip


def xid(node: str) -> FaultDetected:
    return FaultDetected(
        source=SOURCE, job="j", node=node, fault_id=f"xid@{node}", scope=FaultScope.NODE,
        reason="gpu_xid_79",
    )  # fmt: skip


VIEW = ClusterView(nodes=[NodeInfo(name=f"n{i}", slots=2) for i in range(5)], used={})


def test_a_plan_replacing_one_not_carried_out_takes_over_its_stops_and_cluster_changes() -> None:
    rec = record()
    apply_fault(rec, xid("n2"), now=at(0), cluster=VIEW, claimant="a")  # replica 2 -> n3
    first = rec.pending_recovery
    assert first is not None and [m.to_node for m in first.moves] == ["n3"]
    rec.placements = [p for p in rec.placements if p.replica != 0]  # as if it left, say

    apply_fault(rec, xid("n1"), now=at(1), cluster=VIEW, claimant="a")
    second = rec.pending_recovery
    assert second is not None and second.to_generation == 3
    assert sorted((p.replica, p.node) for p in second.stop_placements) == [
        (0, "n0"), (1, "n1"), (2, "n2"), (2, "n3"),
    ]  # fmt: skip
    assert second.cordon == ["n1", "n2"]
    assert [(m.replica, m.from_node) for m in second.moves] == [(2, "n2"), (1, "n1")]


def test_a_plan_replacing_one_carried_out_owes_only_its_own() -> None:
    rec = record()
    apply_fault(rec, xid("n2"), now=at(0), cluster=VIEW, claimant="a")
    assert mark_dispatched(rec, 2)
    apply_fault(rec, xid("n1"), now=at(1), cluster=VIEW, claimant="a")
    plan = rec.pending_recovery
    assert plan is not None and plan.cordon == ["n1"]
    assert [(m.replica, m.from_node) for m in plan.moves] == [(1, "n1")]
    assert {(p.replica, p.node) for p in plan.stop_placements} == {(0, "n0"), (1, "n1"), (2, "n3")}


def test_supersede_keeps_the_new_plan_and_same_plan_ignores_claims() -> None:
    rec = record()
    apply_fault(rec, crash("c1"), now=at(0), claimant="a")
    plan = rec.pending_recovery
    assert plan is not None
    assert supersede(None, plan) is plan
    assert same_plan(plan, plan.model_copy(update={"claimed_by": "b", "dispatched": True}))
    assert not same_plan(plan, plan.model_copy(update={"to_generation": 9}))


def test_a_failed_job_notes_its_last_steps_with_its_phase() -> None:
    rec = record(jobMaxRetryCount=1)
    apply_fault(rec, xid("n2"), now=at(0), cluster=VIEW, claimant="a")  # not carried out
    decision = apply_fault(rec, crash("c", None), now=at(1), claimant="a", lease_seconds=3)
    assert decision.verdict is Verdict.FAIL and rec.phase is JobPhase.FAILED
    ending = rec.ending
    assert ending is not None and not ending.done
    assert (ending.previous, ending.reason, ending.claimed_by) == (
        JobPhase.RECOVERING,
        decision.why,
        "a",
    )
    assert ending.claimed_until == at(4)
    # where it runs now, and where the plan it never carried out had a replica to stop
    assert sorted((p.replica, p.node) for p in ending.placements) == [
        (0, "n0"), (1, "n1"), (2, "n2"), (2, "n3"),
    ]  # fmt: skip


def test_last_steps_are_claimed_once_lapsed_and_marked_done_one_by_one() -> None:
    rec = record()
    rec.phase = JobPhase.SUCCEEDED
    begin_ending(
        rec, previous=JobPhase.RUNNING, reason="job succeeded", plan=None, claimant="scaler",
        now=at(0), lease_seconds=3,
    )  # fmt: skip
    assert next_look(rec) == at(3)
    assert not claim_ending(rec, "r", at(1), 3)  # the scaler is at it
    assert claim_ending(rec, "scaler", at(1), 3)  # it may go on
    assert claim_ending(rec, "r", at(5), 3)  # lapsed
    assert rec.ending is not None and rec.ending.claimed_until == at(8)
    assert not mark_ended(rec, "another run", "stopped")
    for step in ("stopped", "announced", "released"):
        assert next_look(rec) is not None
        assert mark_ended(rec, "run", step) and not mark_ended(rec, "run", step)
    assert rec.ending.done and next_look(rec) is None
    assert not claim_ending(rec, "r", at(60), 3)


def test_next_look_is_the_end_of_a_claim_or_at_once() -> None:
    rec = record()
    assert next_look(rec) is None
    apply_fault(rec, crash("c1"), now=at(0), claimant="a", lease_seconds=3)
    assert next_look(rec) == at(3)
    assert rec.pending_recovery is not None
    rec.pending_recovery = rec.pending_recovery.model_copy(
        update={"claimed_by": "", "claimed_until": None}  # a resize the scaler wrote
    )
    assert next_look(rec) == ASAP
    assert mark_dispatched(rec, 2) and next_look(rec) is None
    assert RecoveryLevel.PROCESS in rec.restarts
