"""A node's score across jobs and its quarantine, and the attribution table (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest

from resurge.control.decisions.node_attribution import attribute, rules, table_version
from resurge.control.decisions.node_score import (
    INCIDENT_SECONDS,
    NodePolicy,
    apply_incident,
    current_score,
    release,
    release_after_check,
)
from resurge.control.state.node_health import NodeHealth
from resurge.events import FaultDetected, FaultScope, Source

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
DETECTOR = Source(service="detector", instance="d")


def fault(
    reason: str,
    *,
    at: float = 0.0,
    job: str = "a",
    node: str | None = "n1",
    fault_id: str | None = None,
    evidence: Mapping[str, str | int] | None = None,
) -> FaultDetected:
    return FaultDetected(
        source=DETECTOR,
        time=T0 + timedelta(seconds=at),
        fault_id=fault_id or f"{reason}:{job}:{at}",
        scope=FaultScope.NODE,
        reason=reason,
        evidence=dict(evidence or {}),
        job=job,
        node=node,
    )


def xid48(at: float, job: str = "a") -> FaultDetected:
    return fault("gpu_xid", at=at, job=job, evidence={"xid": 48, "action": "reset_gpu"})


def count(record: NodeHealth, f: FaultDetected, policy: NodePolicy | None = None) -> bool:
    counted = attribute(f)
    assert counted is not None, f"{f.reason} {f.evidence} is not attributed"
    return apply_incident(record, f, counted, f.time, policy or NodePolicy())


# -- the attribution table ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "evidence", "rule"),
    [
        ("gpu_xid", {"xid": 48, "action": "reset_gpu"}, "xid_takes_gpu_out"),
        ("gpu_xid", {"xid": 79, "action": "replace_node"}, "xid_takes_gpu_out"),
        ("gpu_xid", {"xid": 94, "action": "restart_process"}, "xid_contained_memory_error"),
        ("gpu_fell_off_bus", {}, "gpu_fell_off_bus"),
        ("gpu_reset_failed", {}, "gpu_reset_failed"),
        ("gpu_ecc", {}, "uncorrected_ecc_rose"),
        ("node_unhealthy", {}, "node_unhealthy"),
        ("straggler", {}, "straggler"),
        (
            "process_crash",
            {"last_output": "RuntimeError: CUDA error: uncorrectable ECC error encountered"},
            "crash_with_device_evidence",
        ),
        (
            "worker_exception",
            {"message": "CUDA error: uncorrectable ECC error encountered"},
            "exception_with_device_evidence",
        ),
    ],
)
def test_faults_with_device_evidence_count_against_the_node(
    reason: str, evidence: dict[str, str | int], rule: str
) -> None:
    counted = attribute(fault(reason, evidence=evidence))
    assert counted is not None and counted.rule == rule and counted.weight > 0
    assert counted.node == "n1"


@pytest.mark.parametrize(
    ("reason", "evidence"),
    [
        ("process_crash", {"last_output": "ZeroDivisionError: division by zero"}),
        ("worker_exception", {"message": "shapes (3,4) and (5,6) not aligned"}),
        ("gpu_xid", {"xid": 13, "action": "restart_process"}),  # the application's kernel
        ("hang", {}),
        ("log_rule", {}),
        ("something_new", {}),
    ],
)
def test_the_job_s_own_faults_never_count_against_the_node(
    reason: str, evidence: dict[str, str | int]
) -> None:
    assert attribute(fault(reason, evidence=evidence)) is None


def test_a_fault_without_a_node_counts_nowhere_and_evidence_may_name_it() -> None:
    assert attribute(fault("gpu_fell_off_bus", node=None)) is None
    named = attribute(
        fault("gpu_fell_off_bus", node=None).model_copy(update={"evidence": {"node": "n7"}})
    )
    assert named is not None and named.node == "n7"


def test_the_table_is_versioned_and_every_rule_says_what_it_needs() -> None:
    assert table_version() >= 1
    assert all(rule.needs and rule.reason for rule in rules())


# -- the score ---------------------------------------------------------------------------


def test_three_xid_48_across_two_jobs_quarantine_the_node() -> None:
    node = NodeHealth(name="n1")
    assert count(node, xid48(0, "a")) and node.quarantine is None
    assert count(node, xid48(60, "b")) and node.quarantine is None
    assert count(node, xid48(120, "a"))
    assert node.quarantine is not None and not node.quarantine.dry_run
    assert node.quarantine.score == pytest.approx(3.0, abs=0.01)
    assert node.quarantine.threshold == NodePolicy().threshold
    assert "3 x xid_takes_gpu_out (jobs a, b)" in node.quarantine.why
    assert [i.job for i in node.incidents] == ["a", "b", "a"]


def test_one_cause_faulting_every_job_on_the_node_is_one_incident() -> None:
    node = NodeHealth(name="n1")
    same: dict[str, str | int] = {"xid": 48, "action": "reset_gpu"}
    assert count(node, fault("gpu_xid", at=0, job="a", fault_id="gpu:n1:0:48:e1", evidence=same))
    assert not count(
        node, fault("gpu_xid", at=0.01, job="b", fault_id="gpu:n1:0:48:e1", evidence=same)
    )
    assert not count(node, fault("node_unhealthy", at=1, job="a"))  # its consequence
    assert count(node, fault("node_unhealthy", at=1 + INCIDENT_SECONDS + 1, job="b"))
    assert not count(node, fault("node_unhealthy", at=1.1 + INCIDENT_SECONDS + 1, job="a"))
    assert node.counted == 2


def test_one_incident_counts_at_the_highest_weight_among_its_faults() -> None:
    node = NodeHealth(name="n1")
    assert count(node, fault("straggler", at=0))  # 0.25
    assert count(node, fault("gpu_fell_off_bus", at=1))  # 2.0: the same incident, raised
    assert node.counted == 1
    [incident] = node.incidents
    assert (incident.rule, incident.weight) == ("gpu_fell_off_bus", 2.0)
    assert node.score == pytest.approx(2.0, abs=0.01)


def test_an_xid_and_the_ecc_rise_on_the_same_gpu_are_one_incident() -> None:
    node = NodeHealth(name="n1")
    on_gpu: dict[str, str | int] = {"xid": 48, "action": "reset_gpu", "gpu": 3}
    assert count(node, fault("gpu_xid", at=0, evidence=on_gpu))
    assert not count(node, fault("gpu_ecc", at=1, evidence={"gpu": 3}))
    assert count(node, fault("gpu_ecc", at=1, evidence={"gpu": 2}))  # another GPU
    assert [i.gpu for i in node.incidents] == [3, 2]


def test_a_redelivered_fault_counts_once() -> None:
    node = NodeHealth(name="n1")
    assert count(node, xid48(0))
    assert not count(node, xid48(0))
    assert node.counted == 1


def test_the_score_halves_every_half_life() -> None:
    policy = NodePolicy(half_life_hours=1.0)
    node = NodeHealth(name="n1")
    count(node, xid48(0), policy)
    assert current_score(node, T0 + timedelta(hours=1), policy) == pytest.approx(0.5)
    assert current_score(node, T0 + timedelta(hours=2), policy) == pytest.approx(0.25)


def test_faults_far_apart_decay_below_the_threshold() -> None:
    policy = NodePolicy(half_life_hours=1.0)
    node = NodeHealth(name="n1")
    for hours in (0, 5, 10):
        count(node, xid48(hours * 3600), policy)
    assert node.quarantine is None and node.score < 1.1


def test_dry_run_records_a_quarantine_it_does_not_enforce_and_off_records_none() -> None:
    dry, off = NodeHealth(name="n1"), NodeHealth(name="n2")
    for at in (0, 60, 120):
        count(dry, xid48(at), NodePolicy(mode="dry-run"))
        count(off, xid48(at), NodePolicy(mode="off"))
    assert dry.quarantine is not None and dry.quarantine.dry_run
    assert off.quarantine is None and off.score == pytest.approx(3.0, abs=0.01)


def test_an_operator_s_release_ends_the_quarantine_and_clears_the_score() -> None:
    node = NodeHealth(name="n1")
    for at in (0, 60, 120):
        count(node, xid48(at))
    assert release(node, T0 + timedelta(minutes=5), "operator", "GPU replaced")
    assert node.quarantine is None and node.score == 0
    assert node.last_release is not None and node.last_release.by == "operator"
    assert not release(node, T0 + timedelta(minutes=6), "operator")
    count(node, xid48(600))
    assert node.quarantine is None  # one new fault is not three


def test_a_passed_health_check_releases_with_half_the_threshold_left() -> None:
    node = NodeHealth(name="n1")
    for at in (0, 60, 120):
        count(node, xid48(at))
    held = node.quarantine
    assert held is not None
    later = T0 + timedelta(minutes=30)
    assert not release_after_check(
        node, later, held.since - timedelta(seconds=1), "old", NodePolicy()
    )
    assert release_after_check(node, later, later, "GPU 0 reset; all 8 GPUs answer", NodePolicy())
    assert node.quarantine is None and node.score == pytest.approx(1.25)
    assert node.last_release is not None and node.last_release.by == "health_check"
    assert node.last_release.why == "GPU 0 reset; all 8 GPUs answer"
    assert count(node, xid48(1900)) and node.quarantine is None  # 2.25: one more is needed
    assert count(node, xid48(1960)) and node.quarantine is not None


def test_a_dry_run_s_quarantine_is_never_released_by_a_check() -> None:
    node = NodeHealth(name="n1")
    dry = NodePolicy(mode="dry-run")
    for at in (0, 60, 120):
        count(node, xid48(at), dry)
    assert node.quarantine is not None
    now = T0 + timedelta(hours=1)
    assert not release_after_check(node, now, now, "passed", dry)
