"""The simulator's checkpointless (peer) recovery: a recovery redoes at most the step in
flight while some copy of every part of the state is live, and falls back to the disk
checkpoint, redoing everything since it, when a recovery takes every copy."""

from __future__ import annotations

from typing import Any

import pytest

from resurge.events import RecoveryLevel
from resurge.simulation import ConfigError, parse_config, simulate
from resurge.simulation.costs import price
from resurge.simulation.defaults import DEFAULT_COSTS
from resurge.simulation.failures import Candidate
from resurge.simulation.peer_copies import PeerCopies
from resurge.simulation.single_job import JobRun, JobSettings, run_job

STEP = 10.0

SMALL: dict[str, Any] = {
    "days": 20,
    "cluster": {"nodes": 72, "spares": 8},  # spares enough that node moves rarely requeue
    "failure_rate_scale": 10.0,
    "checkpoint": {"interval_minutes": 20, "write_seconds": 20},
    "step_seconds": STEP,
}
LADDER = {"name": "ladder"}
PEER = {"name": "peer", "peer_recovery": {}}


def _run(body: dict[str, Any], index: int = 0, **kwargs: Any) -> JobRun:
    return run_job(JobSettings.of(parse_config(body), index), **kwargs)


def test_a_recovery_from_live_copies_redoes_at_most_the_step_in_flight() -> None:
    body = {**SMALL, "policies": [LADDER, PEER]}
    disk, peer = _run(body, 0), _run(body, 1)
    step = STEP * 1.02  # a step with the default 2% of snapshots
    live = [seconds for origin, seconds in peer.recoveries if origin == "live"]
    assert len(live) > 50 and len(live) > 0.9 * len(peer.recoveries)
    assert max(live) < step
    # the same failures without it: every recovery goes back to the disk checkpoint
    assert {origin for origin, _ in disk.recoveries} == {"disk"}
    assert sum(s for _, s in disk.recoveries) / len(disk.recoveries) > 10 * STEP
    for origin, seconds in peer.recoveries:
        assert origin == "live" or seconds > 0  # a fall back redoes what it lost
    assert peer.ledger.lost["redone"] < disk.ledger.lost["redone"] / 10
    # the snapshots cost their share of every step kept
    kept = peer.ledger.productive
    assert peer.ledger.lost["snapshot"] == pytest.approx(kept * 0.02)
    wall = SMALL["days"] * 86_400.0
    assert peer.ledger.total == pytest.approx(wall) == disk.ledger.total


def test_the_summary_says_where_recoveries_resumed_and_what_they_redid() -> None:
    summary = simulate(parse_config({**SMALL, "days": 5, "policies": [LADDER, PEER]}))
    disk, peer = summary.results
    assert set(disk.resumes) == {"disk"} and disk.lost_gpu_hours["snapshot"] == 0
    assert peer.resumes["live"] > 10 * peer.resumes.get("disk", 0)
    assert disk.steps_redone["mean"] > 10 > peer.steps_redone["mean"]
    assert "max_live" not in disk.steps_redone and peer.steps_redone["max_live"] < 1
    assert peer.ettr > disk.ettr


def test_a_single_replica_loses_its_only_copy_with_its_node() -> None:
    """One replica, node failures only: every recovery loses the only copy, so with no
    snapshot cost the run is the disk-only run, second for second."""
    body = {
        "days": 20,
        "cluster": {"nodes": 3, "spares": 2},
        "failure_rate_scale": 2000.0,
        "failures": {"host": {"per_1000_node_days": 1.0, "scope": "node",
                              "detection_seconds": 30, "lowest_rung": "node",
                              "repair_hours": 1}},
        "checkpoint": {"interval_minutes": 30, "write_seconds": 20},
        "policies": [LADDER, {"name": "peer", "peer_recovery": {"snapshot_overhead": 0}}],
    }  # fmt: skip
    disk, peer = _run(body, 0), _run(body, 1)
    assert len(peer.recoveries) > 20
    assert {origin for origin, _ in peer.recoveries} == {"disk"}
    assert [o for o, _ in peer.recoveries] == [o for o, _ in disk.recoveries]
    assert [s for _, s in peer.recoveries] == pytest.approx([s for _, s in disk.recoveries])
    assert peer.ledger.lost == pytest.approx(disk.ledger.lost)
    assert peer.ledger.productive == pytest.approx(disk.ledger.productive)


def _two_nodes_lost(state: str, second: int) -> JobRun:
    """4 replicas on nodes 0-3 (two spares), a ladder that tops out at ``node`` (a
    second node lost during the recovery moves too, rather than restarting the job):
    node 1 dies 1,000 s in (100 steps into a 30-minute interval), node ``second`` 5 s
    later."""
    body = {
        "days": 1,
        "cluster": {"nodes": 6, "spares": 2},
        "checkpoint": {"interval_minutes": 30, "write_seconds": 20},
        "policies": [{"name": state, "recovery": {"levels": ["process", "node"]},
                      "peer_recovery": {"state": state, "snapshot_overhead": 0}}],
    }  # fmt: skip
    script = [
        Candidate(time=1000.0, node=1, kind="host", gpu=0),
        Candidate(time=1005.0, node=second, kind="host", gpu=0),
    ]
    run = _run(body, keep_decisions=True, script=script)
    levels = [outcome.level.value for _, _, outcome in run.decisions if outcome.level]
    assert levels == ["node", "node"]
    return run


def test_sharded_state_falls_back_to_disk_when_a_node_and_its_buddy_are_lost() -> None:
    # replica 1's shard is held by replica 1 and its buddy, replica 2
    (recovery,) = _two_nodes_lost("sharded", second=2).recoveries
    assert recovery == ("disk", 1000.0)
    # replicas 1 and 3 lost: every shard still has a copy
    (recovery,) = _two_nodes_lost("sharded", second=3).recoveries
    assert recovery == ("live", 0.0)
    # replicated state: any replica left holds all of it
    (recovery,) = _two_nodes_lost("replicated", second=2).recoveries
    assert recovery == ("live", 0.0)


def test_replicated_state_is_lost_only_with_every_replica() -> None:
    copies = PeerCopies("replicated", 3)
    copies.lose(0)
    copies.lose(1)
    assert copies.complete() and copies.any_lost()
    copies.lose(2)
    assert not copies.complete()
    copies.start_over()
    assert copies.complete() and not copies.any_lost()
    copies.lose_all()  # every worker group recreated (the job rung) or released
    assert not copies.complete()


def test_sharded_state_is_lost_with_a_replica_and_the_next_in_the_ring() -> None:
    copies = PeerCopies("sharded", 4)
    copies.lose(1)
    copies.lose(3)
    assert copies.complete()
    copies.lose(0)  # 3's buddy, around the ring
    assert not copies.complete()
    alone = PeerCopies("sharded", 1)  # its own buddy: no other copy
    alone.lose(0)
    assert not alone.complete()


def test_peer_recovery_is_refused_in_trace_runs() -> None:
    body = {
        "cluster": {"nodes": 8},
        "trace": [{"name": "a", "hours": 1, "min_replicas": 2}],
        "policies": [PEER],
    }
    with pytest.raises(ConfigError, match=r"policies\[0\]\.peer_recovery"):
        parse_config(body)


def _one_fault(levels: list[str], kind: str, spares: int, **peer: float) -> JobRun:
    """2 replicas, one fault on node 0 1,000 s in (100 steps into the interval)."""
    body = {
        "days": 2,
        "cluster": {"nodes": 2 + spares, "spares": spares},
        "checkpoint": {"interval_minutes": 30, "write_seconds": 20},
        "policies": [{"name": "peer", "recovery": {"levels": levels},
                      "peer_recovery": {"snapshot_overhead": 0, **peer}}],
    }  # fmt: skip
    script = [Candidate(time=1000.0, node=0, kind=kind, gpu=0)]
    return _run(body, script=script)


def test_a_restart_that_keeps_some_worker_groups_resumes_from_them() -> None:
    assert _one_fault(["process", "job"], "software", 1).recoveries == [("live", 0.0)]
    assert _one_fault(["pod", "job"], "software", 1).recoveries == [("live", 0.0)]
    assert _one_fault(["node", "job"], "host", 1).recoveries == [("live", 0.0)]


def test_a_replica_that_lost_its_memory_fetches_its_state_from_a_peer() -> None:
    # by default each GPU fetches its own state over its own network (the cost model);
    # 1,250 MB over 1 Gb/s takes 10 s
    ranks = 2 * 8
    fast = _one_fault(["node", "job"], "host", 1).ledger.lost["restart"]
    assert fast == pytest.approx(price(DEFAULT_COSTS, RecoveryLevel.NODE, ranks, resume="peer"))
    slow = _one_fault(["node", "job"], "host", 1, state_mb=1250, bandwidth_gbps=1)
    memory = price(DEFAULT_COSTS, RecoveryLevel.NODE, ranks, resume="memory")
    assert slow.ledger.lost["restart"] == pytest.approx(memory + 10.0)
    # a process restart keeps every node's memory: nothing to fetch, nothing to read
    kept = _one_fault(["process"], "software", 1, state_mb=1250, bandwidth_gbps=1)
    assert kept.ledger.lost["restart"] == pytest.approx(
        price(DEFAULT_COSTS, RecoveryLevel.PROCESS, ranks, resume="memory")
    )


def test_a_restart_that_recreates_or_releases_every_worker_group_goes_to_disk() -> None:
    # the job rung recreates every worker group, and a group's memory goes with it
    assert _one_fault(["job"], "software", 1).recoveries == [("disk", 1000.0)]
    # unless (what if) a recreated group found its predecessor's snapshots
    kept = _one_fault(["job"], "software", 1, recreated_groups_keep_memory=True)
    assert kept.recoveries == [("live", 0.0)]
    # a node lost with no node to move to: the job is requeued, every replica released
    run = _one_fault(["node", "job"], "host", 0)
    assert run.ledger.lost["waiting"] > 0
    assert run.recoveries == [("disk", 1000.0)]
