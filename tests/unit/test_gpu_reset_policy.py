"""An XID that asks for a GPU reset restarts the job where it was, after the reset, and
leaves the node only when the reset cannot be the answer (the recovery policy, pure)."""

from __future__ import annotations

from resurge.control.decisions.recovery_policy import apply_fault, supersede
from resurge.control.state.records import GpuOnNode
from resurge.events import FaultDetected, FaultScope, RecoveryLevel
from tests.unit.test_restart_policy import at, cluster, fault, progressed, record


def xid48(
    fault_id: str, generation: int, node: str = "n0", action: str = "reset_gpu"
) -> FaultDetected:
    one = fault(
        fault_id, generation, rank=None, replica=0, scope=FaultScope.NODE,
        reason="gpu_xid", node=node, suggested=RecoveryLevel.NODE,
    )  # fmt: skip
    return one.model_copy(update={"evidence": {"xid": 48, "gpu": 1, "action": action}})


def test_a_reset_xid_restarts_in_place_with_the_gpu_reset_between() -> None:
    rec = record()
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2))
    decision = apply_fault(rec, xid48("x", 0), now=at(0), cluster=view, gpu_resets=True)
    plan = rec.pending_recovery
    assert decision.level is RecoveryLevel.PROCESS and plan is not None
    assert plan.reset_gpus == [GpuOnNode(node="n0", gpu=1)]
    assert plan.moves == [] and plan.cordon == [] and rec.avoid_nodes == []
    assert sorted((p.replica, p.node) for p in rec.placements) == [(0, "n0"), (1, "n1")]
    assert "GPU reset" in rec.message


def test_without_gpu_resets_or_for_a_replace_xid_the_job_leaves_the_node() -> None:
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2))
    for resets, action in ((False, "reset_gpu"), (True, "replace_node")):
        rec = record()
        decision = apply_fault(rec, xid48("x", 0, action=action), now=at(0), cluster=view,
                               gpu_resets=resets)  # fmt: skip
        assert decision.level is RecoveryLevel.NODE, (resets, action)
        assert rec.pending_recovery is not None and rec.pending_recovery.reset_gpus == []
        assert [m.to_node for m in rec.pending_recovery.moves] == ["n2"]


def test_the_same_xid_again_after_the_reset_moves_the_job_off() -> None:
    rec = record(evalPeriodSeconds=600)
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2))
    apply_fault(rec, xid48("x1", 0), now=at(0), cluster=view, gpu_resets=True)
    progressed(rec, 30)  # the restart after the reset trained
    decision = apply_fault(rec, xid48("x2", 1), now=at(60), cluster=view, gpu_resets=True)
    assert decision.level is RecoveryLevel.NODE
    plan = rec.pending_recovery
    assert plan is not None and plan.reset_gpus == [] and plan.cordon == ["n0"]


def test_an_xid_before_the_reset_generation_trained_moves_the_job_off() -> None:
    rec = record(evalPeriodSeconds=1)
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2))
    apply_fault(rec, xid48("x1", 0), now=at(0), cluster=view, gpu_resets=True)
    decision = apply_fault(rec, xid48("x2", 1), now=at(5), cluster=view, gpu_resets=True)
    assert decision.level is RecoveryLevel.NODE
    assert rec.pending_recovery is not None and rec.pending_recovery.reset_gpus == []


def test_a_cordoned_node_is_left_not_reset() -> None:
    rec = record()
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2))
    view.nodes[0] = view.nodes[0].model_copy(update={"cordoned": True})
    decision = apply_fault(rec, xid48("x", 0), now=at(0), cluster=view, gpu_resets=True)
    assert decision.level is RecoveryLevel.NODE
    assert rec.pending_recovery is not None and rec.pending_recovery.reset_gpus == []


def test_a_plan_replaced_before_it_went_out_keeps_its_reset() -> None:
    rec = record()
    view = cluster(("n0", 0), ("n1", 0), ("n2", 2))
    apply_fault(rec, xid48("x", 0), now=at(0), cluster=view, gpu_resets=True)
    old = rec.pending_recovery
    assert old is not None
    new = old.model_copy(update={"reset_gpus": [], "fault_id": "y"})
    assert supersede(old, new).reset_gpus == [GpuOnNode(node="n0", gpu=1)]
