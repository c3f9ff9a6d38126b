"""The simulator's bad nodes, node quarantine and proactive moves (issue 31, item 5)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from resurge.events import RecoveryLevel
from resurge.simulation import ConfigError, parse_config, simulate
from resurge.simulation.config import BadNodes, FailureKind, QuarantineConfig
from resurge.simulation.failures import Candidate, FailureStream
from resurge.simulation.node_health import NodeHealth, rate_multipliers
from resurge.simulation.single_job import JobRun, JobSettings, run_job

BAD = BadNodes(fraction=0.05, rate_multiplier=20.0)
HOUR = 3600.0


def test_bad_nodes_are_seeded_and_hold_the_fleet_s_mean_rate() -> None:
    rates = rate_multipliers(1_000, 980, BAD, seed=3)
    assert rates == rate_multipliers(1_000, 980, BAD, seed=3)
    assert rates != rate_multipliers(1_000, 980, BAD, seed=4)
    assert sum(rates) / len(rates) == pytest.approx(1.0, abs=1e-12)
    bad = [i for i, r in enumerate(rates) if r > min(rates)]
    assert len(bad) == 50
    # spread among the job's first nodes and the rest: 49 of 980 and 1 of 20
    assert sum(1 for i in bad if i < 980) == 49
    assert max(rates) / min(rates) == pytest.approx(20.0)
    # the study's shape: 5% of the nodes cause just over half of what counts against nodes
    assert sum(rates[i] for i in bad) / sum(rates) == pytest.approx(0.513, abs=0.001)
    assert rate_multipliers(1_000, 980, None, seed=3) == [1.0] * 1_000


def test_the_stream_draws_attributed_kinds_by_node_rate_and_keeps_the_total() -> None:
    kinds = {
        "gpu": FailureKind(per_1000_node_days=3.0, scope="node"),
        "software": FailureKind(per_1000_node_days=1.0, scope="process"),
    }
    rates = rate_multipliers(200, 200, BAD, seed=1)
    bad = {i for i, r in enumerate(rates) if r > min(rates)}
    uniform = FailureStream(kinds, 200, 8, seed=5)
    weighted = FailureStream(kinds, 200, 8, seed=5, weights=rates)
    assert weighted.rate == pytest.approx(uniform.rate, rel=1e-12)
    on_bad: Counter[str] = Counter()
    drawn: Counter[str] = Counter()
    now = 0.0
    for _ in range(40_000):
        candidate = weighted.after(now)
        assert candidate is not None
        now = candidate.time
        drawn[candidate.kind] += 1
        on_bad[candidate.kind] += candidate.node in bad
    assert drawn["gpu"] / sum(drawn.values()) == pytest.approx(0.75, abs=0.01)
    assert on_bad["gpu"] / drawn["gpu"] == pytest.approx(0.513, abs=0.015)
    assert on_bad["software"] / drawn["software"] == pytest.approx(0.05, abs=0.01)


def test_the_score_decays_by_its_half_life_and_quarantines_at_the_threshold() -> None:
    quarantine = QuarantineConfig(threshold=1.5, half_life_hours=10.0)
    health = NodeHealth([1.0] * 4, quarantine, proactive=False, seed=0)
    assert not health.fault(0.0, 1)
    assert health.score_of(1, 10 * HOUR) == pytest.approx(0.5)
    assert not health.fault(20 * HOUR, 1)  # 0.25 + 1
    assert health.fault(25 * HOUR, 1)  # 1.25 / sqrt(2) + 1 = 1.88
    assert health.quarantined == {1}
    assert not health.fault(26 * HOUR, 1)  # already quarantined
    assert health.counts["quarantines"] == 1


@pytest.mark.parametrize(("fixed", "rate_after"), [(1.0, "good"), (0.0, "bad")])
def test_a_node_back_from_quarantine_is_fixed_with_the_probability(
    fixed: float, rate_after: str
) -> None:
    rates = rate_multipliers(100, 100, BAD, seed=2)
    node = rates.index(max(rates))
    quarantine = QuarantineConfig(threshold=1.0, fixed_probability=fixed)
    health = NodeHealth(rates, quarantine, proactive=False, seed=0)
    assert health.fault(0.0, node)
    health.returned(node)
    assert health.quarantined == set() and health.score_of(node, 0.0) == 0.0
    expected = min(rates) if rate_after == "good" else max(rates)
    assert health.rate[node] == expected
    accepted = sum(health.accepts(node) for _ in range(20_000)) / 20_000
    assert accepted == pytest.approx(expected / max(rates), abs=0.01)


def settings(
    nodes: int = 6,
    spares: int = 2,
    *,
    policy: dict[str, Any] | None = None,
    failures: dict[str, Any] | None = None,
    bad: bool = False,
) -> JobSettings:
    body: dict[str, Any] = {
        "days": 2,
        "cluster": {"nodes": nodes, "spares": spares},
        "failures": failures
        or {
            "gpu": {
                "per_1000_node_days": 1,
                "scope": "node",
                "detection_seconds": 10,
                "lowest_rung": "node",
                "repair_hours": 1,
            }
        },
        "checkpoint": {"interval_minutes": 30, "write_seconds": 30},
        "policies": [{"name": "p", **(policy or {})}],
    }
    if bad:
        body["cluster"]["bad_nodes"] = {"fraction": 0.5}
    return JobSettings.of(parse_config(body), 0)


def gpu_faults(node: int, hours: list[float]) -> list[Candidate]:
    return [Candidate(time=h * HOUR, node=node, kind="gpu", gpu=0) for h in hours]


def ledger_adds_up(run: JobRun, days: float = 2) -> None:
    ledger = run.ledger
    assert ledger.productive + sum(ledger.lost.values()) == pytest.approx(days * 86_400.0)


def test_a_quarantined_node_fails_no_more() -> None:
    """Node 0 fails every 2 hours (its repair takes 1): it counts 5 faults against
    it; quarantined at its second (two within a week), it is away for its 100 hours and
    fails no more; a dry run only counts the node it would have quarantined."""
    script = gpu_faults(0, [1, 3, 5, 7, 9])
    bare = run_job(settings(), script=script)
    quarantine = {"threshold": 1.5, "hours": 100}
    dry = run_job(settings(policy={"quarantine": {**quarantine, "dry_run": True}}), script=script)
    held = run_job(settings(policy={"quarantine": quarantine}), script=script)
    assert bare.nodes == {}
    assert dry.nodes["attributed_faults"] == 5 and dry.nodes["would_quarantine"] == 1
    assert "quarantines" not in dry.nodes
    assert dry.ledger == bare.ledger
    assert held.nodes["attributed_faults"] == 2 and held.nodes["quarantines"] == 1
    assert held.faults["gpu"] == 1  # the first, on the job; the second was on a free node
    ledger_adds_up(held)


def test_quarantine_moves_the_job_off_at_the_node_rung() -> None:
    """A kind attributed to its node that needs only a process restart: at the fault
    that quarantines its node, the policy moves the replica off it (a node restart,
    priced by the cost model), and the node's later faults do not reach the job."""
    failures = {
        "ecc": {
            "per_1000_node_days": 1,
            "scope": "process",
            "attributed": True,
            "lowest_rung": "process",
            "detection_seconds": 1,
        }
    }
    script = [Candidate(time=h * HOUR, node=1, kind="ecc", gpu=0) for h in (1, 2, 3, 4)]
    bare = run_job(settings(failures=failures), script=script)
    held = run_job(
        settings(failures=failures, policy={"quarantine": {"threshold": 1.9, "hours": 100}}),
        script=script,
    )
    assert bare.faults["ecc"] == 4 and "node" not in bare.restarts
    assert held.faults["ecc"] == 2
    assert held.restarts["node"] == 1
    assert held.nodes["quarantines"] == 1 and held.nodes["attributed_faults"] == 2
    ledger_adds_up(held)


def test_a_predicted_failure_costs_a_planned_move_and_no_steps() -> None:
    """Warning signs announce every gpu fault: the job writes a checkpoint at once and
    moves off the node before it fails, redoing nothing; without proactive moves the
    same fault loses the training since the last checkpoint."""
    failures = {
        "gpu": {
            "per_1000_node_days": 1,
            "scope": "node",
            "lowest_rung": "node",
            "detection_seconds": 10,
            "predictable_fraction": 1.0,
        }
    }
    script = gpu_faults(2, [1.4])  # 24 minutes into an interval
    crash = run_job(settings(failures=failures), script=script)
    moved = run_job(settings(failures=failures, policy={"proactive_moves": True}), script=script)
    assert crash.ledger.lost["redone"] > 20 * 60
    ((origin, redone),) = crash.recoveries
    assert origin == "disk" and redone == pytest.approx(crash.ledger.lost["redone"])
    assert moved.ledger.lost["redone"] == 0.0
    assert moved.moves == [("disk", 0.0)] and moved.recoveries == []
    assert moved.faults == Counter() and moved.restarts == Counter()
    assert moved.nodes["planned_moves"] == 1
    assert crash.restarts == Counter({"node": 1})
    node_move = settings().pricing.seconds(RecoveryLevel.NODE)
    assert moved.ledger.lost["restart"] == pytest.approx(node_move)
    assert moved.ledger.lost["detection"] == 0.0
    assert moved.ledger.productive > crash.ledger.productive
    ledger_adds_up(moved)


def test_a_predicted_failure_with_no_free_node_crashes_as_any_other() -> None:
    failures = {
        "gpu": {"per_1000_node_days": 1, "scope": "node", "lowest_rung": "node",
                "predictable_fraction": 1.0},
    }  # fmt: skip
    run = run_job(
        settings(spares=0, failures=failures, policy={"proactive_moves": True}),
        script=gpu_faults(2, [1.4]),
    )
    assert run.nodes["predicted"] == 1 and "planned_moves" not in run.nodes
    assert run.faults["gpu"] == 1 and run.ledger.lost["redone"] > 0


def fleet(bad: bool, policy: dict[str, Any]) -> dict[str, Any]:
    cluster: dict[str, Any] = {"nodes": 200, "spares": 10}
    if bad:
        cluster["bad_nodes"] = {"fraction": 0.05}
    return {
        "days": 60,
        "seed": 2,
        "cluster": cluster,
        "failure_rate_scale": 4.0,
        "failures": {"gpu": {"per_1000_node_days": 4.06, "scope": "node",
                             "lowest_rung": "node", "predictable_fraction": 0.2}},
        "checkpoint": {"interval_minutes": 15, "write_seconds": 30},
        "policies": [policy],
    }  # fmt: skip


def test_a_fleet_with_bad_nodes_fails_as_often_and_quarantine_removes_them() -> None:
    """Mean held: the fleet with bad nodes meets as many candidates as the uniform one,
    about half of them on its 5% bad nodes; quarantine takes out mostly bad nodes and
    the job meets fewer faults; proactive moves turn some into planned moves."""
    dry = {"name": "dry", "quarantine": {"dry_run": True}}
    uniform = simulate(parse_config(fleet(False, dry))).results[0]
    bad = simulate(parse_config(fleet(True, dry))).results[0]
    held = simulate(parse_config(fleet(True, {"name": "q", "quarantine": {}}))).results[0]
    both = {"name": "q+p", "quarantine": {}, "proactive_moves": True}
    moved = simulate(parse_config(fleet(True, both))).results[0]
    ratio = bad.nodes["attributed_faults"] / uniform.nodes["attributed_faults"]
    assert ratio == pytest.approx(1.0, abs=0.1)
    assert bad.nodes["on_bad_nodes"] / bad.nodes["attributed_faults"] > 0.4
    assert bad.nodes["bad_nodes"] == 10 and uniform.nodes["bad_nodes"] == 0
    assert held.nodes["quarantined_bad"] >= 5
    # 5% of the fleet, most of those quarantined
    assert held.nodes["quarantined_bad"] / held.nodes["quarantines"] > 0.6
    assert sum(held.faults.values()) < sum(bad.faults.values())
    assert moved.nodes["planned_moves"] > 0
    assert sum(moved.faults.values()) < sum(held.faults.values())
    for result in (uniform, bad, held, moved):
        spent = result.productive_gpu_hours + sum(result.lost_gpu_hours.values())
        assert spent == pytest.approx(60 * 24 * result.gpus, rel=1e-6)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cluster": {"nodes": 4, "bad_nodes": {"fraction": 1.5}}},
         r"cluster\.bad_nodes\.fraction"),
        ({"cluster": {"nodes": 4, "bad_nodes": {"fraction": 0.1, "rate_multiplier": 0.5}}},
         r"cluster\.bad_nodes\.rate_multiplier"),
        ({"policies": [{"name": "q", "quarantine": {"threshold": 0}}]},
         r"policies\[0\]\.quarantine\.threshold"),
        ({"policies": [{"name": "q", "quarantine": {"fixed_probability": 2}}]},
         r"policies\[0\]\.quarantine\.fixed_probability"),
        ({"policies": [{"name": "q", "quarantine": {"halflife": 2}}]},
         r"policies\[0\]\.quarantine\.halflife"),
        ({"failures": {"gpu": {"per_1000_node_days": 1, "scope": "node",
                               "predictable_fraction": 1.2}}},
         r"failures\.gpu\.predictable_fraction"),
        ({"trace": [{"name": "a", "hours": 1, "min_replicas": 1}],
          "policies": [{"name": "q", "quarantine": {}}]},
         r"policies\[0\]\.quarantine is modelled in one-job runs only"),
        ({"trace": [{"name": "a", "hours": 1, "min_replicas": 1}],
          "cluster": {"nodes": 4, "bad_nodes": {"fraction": 0.1}}},
         r"cluster\.bad_nodes is modelled in one-job runs only"),
    ],
)  # fmt: skip
def test_config_errors_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_config({"cluster": {"nodes": 4}, **change})
