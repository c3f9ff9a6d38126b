"""The recovery ladder and the record changes of each decision: pure functions, no I/O."""

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from resurge.cluster import NodeInfo
from resurge.control.decisions.recovery_policy import (
    SETTLE_SECONDS,
    ClusterView,
    Verdict,
    apply_checkpoint,
    apply_fault,
    apply_rendezvous,
    apply_settled,
    apply_sign_of_life,
    apply_worker_succeeded,
    backoff_seconds,
    claim,
    mark_dispatched,
    settle_due,
)
from resurge.control.state.records import JobRecord, Placement, RestartEntry
from resurge.events import FaultDetected, FaultScope, JobPhase, RecoveryLevel, Source
from resurge.local import job_factory

SOURCE = Source(service="detector", instance="here:1")
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def record(max_restarts: int | None = 5, replicas: int = 2, **recovery: Any) -> JobRecord:
    if max_restarts is not None:
        recovery["jobMaxRetryCount"] = max_restarts
    job = job_factory.job("j", nproc=2, replicas=replicas, recovery=recovery, preload=None)
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


def progressed(rec: JobRecord, seconds: float, step: int = 1000) -> None:
    """The record's current generation completes ``step`` at ``seconds``."""
    apply_sign_of_life(rec, rec.generation, at(seconds), progress=True, step=step)


def test_independent_faults_on_other_ranks_each_get_the_cheapest_rung() -> None:
    rec = record()
    levels = []
    for g, rank in enumerate([1, 2, 3]):
        levels.append(apply_fault(rec, fault(f"f{g}", g, rank=rank), now=at(60 * g)).level)
        assert rec.pending_recovery is not None
        assert rec.pending_recovery.start_at == at(60 * g)  # no backoff for a new incident
        progressed(rec, 60 * g + 1)
    assert levels == [RecoveryLevel.PROCESS] * 3
    assert rec.phase is JobPhase.RUNNING and rec.restarts == {RecoveryLevel.PROCESS: 3}


def test_a_fault_before_the_new_generation_made_progress_climbs_a_rung() -> None:
    rec = record()
    progressed(rec, 0)
    first = apply_fault(rec, fault("a", 0, rank=1), now=at(1))
    apply_sign_of_life(rec, 1, at(1.5), progress=False)  # workers start, then one fails
    second = apply_fault(rec, fault("b", 1, rank=2, reason="hang"), now=at(2))
    assert (first.level, second.level) == (RecoveryLevel.PROCESS, RecoveryLevel.POD)
    assert "generation 1 made no step past the resume point" in rec.message


def test_progress_past_the_resume_point_means_the_restart_worked() -> None:
    rec = record()
    for rank in range(4):
        apply_checkpoint(rec, rank, 40, "/c/40", generation=0, world_size=4)
    apply_fault(rec, fault("a", 0, rank=1), now=at(0))
    assert rec.resume_step == 40
    apply_sign_of_life(rec, 1, at(1), progress=True, step=40)
    assert rec.progressed_generation is None  # not past the resume point yet
    apply_sign_of_life(rec, 1, at(2), progress=True, step=41)
    assert rec.progressed_generation == 1
    assert apply_fault(rec, fault("b", 1, rank=2), now=at(3)).level is RecoveryLevel.PROCESS


def test_workers_without_progress_reports_settle_after_running_a_while() -> None:
    rec = record()
    apply_fault(rec, fault("a", 0, rank=1), now=at(0))
    apply_sign_of_life(rec, 1, at(1), progress=False)
    early = rec.model_copy(deep=True)
    assert apply_fault(early, fault("b", 1, rank=2), now=at(10)).level is RecoveryLevel.POD
    late = apply_fault(rec, fault("b", 1, rank=2), now=at(1 + SETTLE_SECONDS))
    assert late.level is RecoveryLevel.PROCESS


def test_the_same_fault_at_the_same_place_climbs_even_after_progress() -> None:
    rec = record()
    apply_fault(rec, fault("a", 0, rank=1), now=at(0))
    progressed(rec, 1)
    again = apply_fault(rec, fault("b", 1, rank=1), now=at(100))
    assert again.level is RecoveryLevel.POD
    progressed(rec, 101)
    other = apply_fault(rec, fault("c", 2, rank=1, reason="hang"), now=at(200))
    assert other.level is RecoveryLevel.PROCESS  # another reason: not the same fault


def test_peers_failing_their_collectives_stay_one_incident() -> None:
    rec = record()
    apply_fault(rec, fault("a", 0, rank=1, reason="process_killed"), now=at(0))
    for rank in (0, 2, 3):  # the peers' collectives fail a moment later: generation 0
        peer = fault(f"peer{rank}", 0, rank=rank, reason="process_crash")
        assert apply_fault(rec, peer, now=at(0.5)).verdict is Verdict.IGNORE
    assert rec.restarts == {RecoveryLevel.PROCESS: 1} and rec.generation == 1


def test_a_day_of_independent_process_faults_never_fails_or_climbs() -> None:
    """24 simulated hours, a process fault every 10 minutes (give or take two) on a
    random rank of a 16,384-rank job, each after the job trained again."""
    rng = random.Random(2026)
    rec = record(max_restarts=None, replicas=2048)
    rec.spec = rec.spec.model_copy(
        update={"spec": rec.spec.spec.model_copy(update={"nproc_per_node": 8})}
    )
    now, step = 0.0, 0
    while now < 24 * 3600:
        now += 600 + rng.uniform(-120, 120)
        rank = rng.randrange(rec.world_size)
        reason = rng.choice(["process_crash", "process_killed", "hang", "worker_exception"])
        culprit = fault(f"f{rec.generation}", rec.generation, rank=rank, reason=reason)
        culprit = culprit.model_copy(update={"replica": rank // 8})
        decision = apply_fault(rec, culprit, now=at(now))
        assert decision.verdict is Verdict.RESTART, decision.why
        assert decision.level is RecoveryLevel.PROCESS, decision.why
        for peer in rng.sample(range(rec.world_size), 3):  # peers fail in the old generation
            late = fault(f"p{rec.generation}-{peer}", rec.generation - 1, rank=peer)
            assert apply_fault(rec, late, now=at(now + 1)).verdict is Verdict.IGNORE
        apply_sign_of_life(rec, rec.generation, at(now + 2), progress=False)
        step += 50
        apply_sign_of_life(rec, rec.generation, at(now + 3), progress=True, step=step)
    assert rec.phase is JobPhase.RUNNING and set(rec.restarts) == {RecoveryLevel.PROCESS}
    assert rec.restarts[RecoveryLevel.PROCESS] >= 140


@pytest.mark.parametrize("capable", [False, True])
@pytest.mark.parametrize("progress_first", [False, True])
def test_a_rank_that_crashes_in_every_generation_fails_within_8_crashes(
    capable: bool, progress_first: bool
) -> None:
    """Defaults throughout: no jobMaxRetryCount, no per-level limits set."""
    job = job_factory.job("j", nproc=2, replicas=2, preload=None)
    rec = JobRecord(name="j", spec=job, phase=JobPhase.RUNNING, in_process_capable=capable,
                    placements=[Placement(replica=r, node=f"n{r}") for r in range(2)])  # fmt: skip
    levels = []
    for crash in range(1, 9):
        if progress_first:  # it crashes at the same place after training a few steps
            progressed(rec, 10 * crash - 5)
        culprit = fault(f"c{crash}", rec.generation, rank=1, suggested=None)
        decision = apply_fault(rec, culprit, now=at(10 * crash))
        if decision.verdict is Verdict.FAIL:
            break
        levels.append(decision.level)
    assert decision.verdict is Verdict.FAIL, levels
    assert rec.phase is JobPhase.FAILED and crash <= 8
    assert "process_crash (c" in rec.message and "maxRestartsPerLevel.job=3" in rec.message
    first = RecoveryLevel.IN_PROCESS if capable else RecoveryLevel.PROCESS
    assert levels[0] is first and levels[-1] is RecoveryLevel.JOB
    assert levels == sorted(levels, key=list(RecoveryLevel).index)  # it only climbs
    assert RecoveryLevel.NODE not in levels


def test_a_repeat_outside_the_eval_period_starts_low_again() -> None:
    rec = record(evalPeriodSeconds=60)
    apply_fault(rec, fault("a", 0), now=at(0))
    progressed(rec, 30)  # generation 1 trained: the same fault again is a new incident
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
    levels = []
    for g in range(3):
        levels.append(apply_fault(rec, fault(f"f{g}", g, reason=f"r{g}"), now=at(g)).level)
        progressed(rec, g + 0.5)
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


def node_lost(fault_id: str, generation: int, node: str) -> FaultDetected:
    return fault(
        fault_id, generation, rank=None, replica=None, scope=FaultScope.NODE,
        reason="node_lost", node=node, suggested=RecoveryLevel.NODE,
    )  # fmt: skip


def test_two_nodes_lost_together_each_move_their_replica() -> None:
    # Both nodes of a 2-replica job die at once; the first loss moves replica 0 and
    # starts generation 1, which still runs replica 1 on the other lost node. That
    # loss, seen in generation 0, was ignored as stale: generation 1 waited for a
    # replica that never came, until its rendezvous timed out (a CI run, 2 minutes).
    rec = record()
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2), ("n3", 2))
    apply_fault(rec, node_lost("lost-n0", 0, "n0"), now=at(0), cluster=view)
    assert rec.generation == 1 and {p.node for p in rec.placements} == {"n2", "n1"}

    view = cluster(("n0", 0), ("n1", 0), ("n2", 0), ("n3", 2))
    decision = apply_fault(rec, node_lost("lost-n1", 0, "n1"), now=at(1), cluster=view)

    assert decision.verdict is Verdict.RESTART and rec.generation == 2
    assert {p.node for p in rec.placements} == {"n2", "n3"}
    # A crash of generation 0 is still a peer's echo, and so is a loss of a node left.
    assert apply_fault(rec, fault("b", 0), now=at(2)).verdict is Verdict.IGNORE
    assert apply_fault(rec, node_lost("lost-n0-again", 1, "n0"), now=at(2)).verdict is (
        Verdict.IGNORE
    )


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


def test_rendezvous_closes_recovery_when_workers_report_no_progress() -> None:
    rec = record()
    bad = fault("a", 0)
    apply_fault(rec, bad, now=at(0))
    apply_rendezvous(rec, 0, at(0.1))  # the old generation's, late: it closes nothing
    assert rec.pending_recovery is not None
    apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.25), progress=False)
    assert rec.pending_recovery is not None  # a worker start ends no recovery
    assert apply_rendezvous(rec, 1, bad.time + timedelta(seconds=0.75))
    assert rec.phase is JobPhase.RUNNING and rec.pending_recovery is None
    assert rec.last_recovery_seconds == 0.75  # the fault's detection to the rendezvous
    assert rec.rendezvous_generation == 1
    assert not apply_rendezvous(rec, 1, bad.time + timedelta(seconds=1))


def test_a_worker_start_is_no_recovery_a_crash_loop_never_recovers() -> None:
    """Generations that start and die within a second: none of them trained, so no
    recovery ends, whatever their workers' starts."""
    rec = record()
    for g in range(4):
        decision = apply_fault(rec, fault(f"c{g}", g), now=at(2**g))
        if decision.verdict is Verdict.FAIL:
            break
        apply_sign_of_life(rec, g + 1, at(2**g + 0.5), progress=False)
        assert rec.pending_recovery is not None and rec.phase is JobPhase.RECOVERING
    assert rec.last_recovery is None and rec.last_recovery_seconds is None


def test_independent_kills_of_a_plain_script_after_its_rendezvous_each_get_process() -> None:
    """Rank 1, then 2, then 3 killed a few seconds after the job trained again (its ranks
    passed their rendezvous): three incidents, each at the cheapest rung."""
    rec = record()
    apply_sign_of_life(rec, 0, at(0), progress=False)
    apply_rendezvous(rec, 0, at(1))
    now, levels = 5.0, []
    for rank in (1, 2, 3):
        killed = fault(f"k{rank}", rec.generation, rank=rank, reason="process_killed")
        levels.append(apply_fault(rec, killed, now=at(now)).level)
        apply_sign_of_life(rec, rec.generation, at(now + 0.5), progress=False)
        apply_rendezvous(rec, rec.generation, at(now + 0.8))
        assert rec.last_recovery is not None and rec.last_recovery.to_generation == rec.generation
        now += 4
    assert levels == [RecoveryLevel.PROCESS] * 3


def test_a_worker_of_the_new_generation_that_exits_0_ends_its_recovery() -> None:
    """A script that needs no rendezvous and finishes at once: it did its work."""
    rec = record()
    apply_fault(rec, fault("a", 0), now=at(0))
    assert not apply_worker_succeeded(rec, 0, at(0.1))  # the old generation's: nothing
    apply_sign_of_life(rec, 1, at(0.2), progress=False)
    assert apply_worker_succeeded(rec, 1, at(0.5))
    assert rec.pending_recovery is None and rec.phase is JobPhase.RUNNING
    assert rec.last_recovery is not None and rec.last_recovery.seconds == 0.5


def test_the_settle_time_is_only_for_jobs_that_never_passed_a_rendezvous() -> None:
    rec = record()
    apply_fault(rec, fault("a", 0), now=at(0))
    apply_sign_of_life(rec, 1, at(1), progress=False)
    assert settle_due(rec) == at(1 + SETTLE_SECONDS)
    assert not apply_settled(rec, 1, at(SETTLE_SECONDS))
    assert apply_settled(rec, 1, at(1 + SETTLE_SECONDS))  # its scripts never rendezvous
    assert rec.pending_recovery is None and rec.last_recovery_seconds == 1.0

    joins = record()
    apply_rendezvous(joins, 0, at(0))  # this job's scripts join the agent's store
    apply_fault(joins, fault("a", 0), now=at(1))
    apply_sign_of_life(joins, 1, at(2), progress=False)
    assert settle_due(joins) is None
    assert not apply_settled(joins, 1, at(100))
    late = apply_fault(joins, fault("b", 1, rank=2), now=at(100))  # stuck before rendezvous
    assert late.level is RecoveryLevel.POD


def test_a_failed_job_says_why_in_the_failing_ranks_last_output() -> None:
    rec = record(max_restarts=0)
    lines = "Traceback (most recent call last):\n  boom\npython: can't open file 'x.py'"
    bad = fault("a", 0).model_copy(update={"evidence": {"last_output": lines}})
    assert apply_fault(rec, bad, now=at(0)).verdict is Verdict.FAIL
    assert rec.message.endswith("rank 1's last output: boom | python: can't open file 'x.py'")


def test_first_step_closes_recovery_when_workers_report_progress() -> None:
    rec = record()
    assert apply_sign_of_life(rec, 0, datetime.now(UTC), progress=True)  # learns it reports
    assert rec.reports_progress
    bad = fault("a", 0)
    apply_fault(rec, bad, now=at(0))
    apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.1), progress=False)
    assert rec.pending_recovery is not None  # a worker start is not a step
    assert apply_sign_of_life(rec, 1, bad.time + timedelta(seconds=0.5), progress=True)
    assert rec.pending_recovery is None and rec.last_recovery_seconds == 0.5


def test_alerts_are_not_acted_on() -> None:
    rec = record()
    alert = fault("a", 0).model_copy(update={"alert_only": True})
    assert apply_fault(rec, alert, now=at(0)).verdict is Verdict.IGNORE
    assert rec.generation == 0 and rec.handled_faults == []


def node_health(fault_id: str, generation: int | None, node: str = "n0") -> FaultDetected:
    return fault(
        fault_id, 0, rank=None, replica=None, scope=FaultScope.NODE, reason="node_unhealthy",
        node=node, suggested=RecoveryLevel.NODE,
    ).model_copy(update={"generation": generation})  # fmt: skip


@pytest.mark.parametrize("order", ["xid_first", "node_health_first"])
@pytest.mark.parametrize("late_generation", [None, 1])
def test_an_xid_and_its_nodes_health_fault_are_one_recovery_in_either_order(
    order: str, late_generation: int | None
) -> None:
    rec = record()
    rec.spare_nodes = ["n2"]
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2))
    faults = [xid("x", 0), node_health("h", 0)]
    if order == "node_health_first":
        faults.reverse()
    first = apply_fault(rec, faults[0], now=at(0), cluster=view)
    assert first.verdict is Verdict.RESTART and first.level is RecoveryLevel.NODE
    apply_sign_of_life(rec, 1, at(0.5), progress=False)
    second = faults[1].model_copy(update={"generation": late_generation})  # after g1 started
    snapshot = rec.model_copy(deep=True)
    assert apply_fault(rec, second, now=at(1), cluster=view).verdict is Verdict.IGNORE
    assert rec == snapshot and rec.restarts == {RecoveryLevel.NODE: 1}


def test_a_node_fault_about_an_avoided_node_changes_nothing() -> None:
    rec = record()
    rec.avoid_nodes = ["n0"]  # say the job was requeued back onto it by hand: still avoided
    assert apply_fault(rec, xid("x", 0), now=at(0)).verdict is Verdict.IGNORE
    assert rec.generation == 0


def test_a_node_recovery_never_puts_two_replicas_on_one_nodes_slots() -> None:
    """2 nodes x 2 slots, a 2x2 job, XID on n0: n1's slots are the job's own replica's."""
    rec = record()
    view = ClusterView(nodes=[NodeInfo(name="n0", slots=2), NodeInfo(name="n1", slots=2)])
    decision = apply_fault(rec, xid("x", 0), now=at(0), cluster=view)
    assert decision.verdict is Verdict.RESTART and rec.phase is JobPhase.PENDING
    assert rec.placements == [] and rec.pending_recovery is not None
    assert rec.pending_recovery.requeue and rec.pending_recovery.moves == []
    assert "waiting for capacity" in rec.message


def test_a_hang_names_the_hung_rank_in_the_plan_so_it_is_killed_without_grace() -> None:
    rec = record()
    apply_fault(rec, fault("h", 0, rank=3, reason="hang"), now=at(0))
    assert rec.pending_recovery is not None and rec.pending_recovery.hung_ranks == [3]
    progressed(rec, 1)
    apply_fault(rec, fault("c", 1, rank=2), now=at(2))
    assert rec.pending_recovery is not None and rec.pending_recovery.hung_ranks == []


def test_a_node_fault_climbed_to_the_job_rung_still_leaves_its_node() -> None:
    rec = record()
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2), ("n3", 2))
    apply_fault(rec, xid("x0", 0), now=at(0), cluster=view)  # n0 lost: replica 0 to n2
    assert mark_dispatched(rec, rec.generation)
    view = cluster(("n0", 0), ("n1", 0), ("n2", 0), ("n3", 2))
    # n1 fails before the new generation made progress: the restart "did not fix it",
    # so the ladder climbs to the job rung; it must not restart replica 1 on n1 again.
    decision = apply_fault(rec, xid("x1", 1, node="n1"), now=at(5), cluster=view)
    assert decision.level is RecoveryLevel.JOB
    plan = rec.pending_recovery
    assert plan is not None and plan.cordon == ["n1"]
    assert [(m.replica, m.from_node, m.to_node) for m in plan.moves] == [(1, "n1", "n3")]
    assert plan.recreate == [0]
    assert sorted((p.replica, p.node) for p in rec.placements) == [(0, "n2"), (1, "n3")]
    assert "n1" in rec.avoid_nodes
