"""The detectors around a GPU reset: a node unhealthy only for GPUs that await a reset is
no node fault (each GPU error's own fault decides), and a failed reset is a node fault
that moves the job."""

from __future__ import annotations

from resurge.events import FaultDetected, FaultScope, GpuError, NodeReport, RecoveryLevel
from resurge_detector.node_health import NodeHealthDetector
from tests.unit.test_gpu_health import MONITOR, context, faults, record


def report(unhealthy: list[int], resettable: list[int]) -> NodeReport:
    return NodeReport(
        source=MONITOR, node="n1", slots_total=2, slots_free=0, healthy=not unhealthy,
        unhealthy_gpus=unhealthy, resettable_gpus=resettable,
    )  # fmt: skip


def node_faults(unhealthy: list[int], resettable: list[int]) -> list[str]:
    detector, ctx = NodeHealthDetector(), context(record("a", ["n1", "n2"]))
    detector.observe(report([], []), ctx)
    out = detector.observe(report(unhealthy, resettable), ctx)
    return [e.reason for e in out if isinstance(e, FaultDetected)]


def test_a_node_unhealthy_only_for_gpus_that_await_a_reset_faults_no_job() -> None:
    assert node_faults([1], [1]) == []
    assert node_faults([0, 1], [1]) == ["node_unhealthy"]  # GPU 0 is out for good
    assert node_faults([1], []) == ["node_unhealthy"]  # a cluster that resets no GPU


def test_a_failed_reset_is_a_fatal_node_fault_that_moves_the_job() -> None:
    failed = GpuError(
        source=MONITOR, node="n1", gpu=1, uuid="GPU-1", error="reset_failed",
        message="GPU 1: nvidia-smi exited 3: In use by another client",
    )  # fmt: skip
    [fault] = faults(failed, context(record("a", ["n1"])))
    assert fault.reason == "gpu_reset_failed" and fault.scope is FaultScope.NODE
    assert fault.suggested_level is RecoveryLevel.NODE
    assert fault.evidence["action"] == "replace_node"
    assert "its reset failed (GPU 1: nvidia-smi exited 3" in fault.message
