"""The simulator's cost model: one set of parts for every policy, each rung a choice of
parts, and the config's overrides."""

from __future__ import annotations

from typing import Any

import pytest

from resurge.events import RecoveryLevel
from resurge.simulation import ConfigError, parse_config
from resurge.simulation.costs import PARTS, breakdown, price
from resurge.simulation.defaults import DEFAULT_COSTS
from resurge.simulation.failures import Candidate
from resurge.simulation.single_job import JobSettings, run_job

RANKS = 16_384
LEVELS = list(RecoveryLevel)


def test_every_rung_starts_a_new_generation_on_every_rank() -> None:
    """Every rung forms the process group over every rank and reads the state back: a
    node's restart costs what a job's does, less nothing but the rungs' own parts."""
    for level in LEVELS:
        parts = breakdown(DEFAULT_COSTS, level, RANKS)
        assert parts["group"] == pytest.approx(DEFAULT_COSTS.group_seconds_per_rank * RANKS)
        assert parts["state"] == pytest.approx(
            DEFAULT_COSTS.state_gb_per_gpu / DEFAULT_COSTS.storage_gbps_per_gpu
        )
    node = breakdown(DEFAULT_COSTS, RecoveryLevel.NODE, RANKS)
    job = breakdown(DEFAULT_COSTS, RecoveryLevel.JOB, RANKS)
    # a spare taking over and a worker group recreated in place are the same part, and
    # the new group's cold start is on the critical path of both
    assert node == job
    assert node["worker_group"] == DEFAULT_COSTS.worker_group_seconds
    assert node["process_start"] == DEFAULT_COSTS.cold_start_seconds
    more = price(DEFAULT_COSTS, RecoveryLevel.NODE, 8 * RANKS) - price(
        DEFAULT_COSTS, RecoveryLevel.NODE, RANKS
    )
    assert more == pytest.approx(DEFAULT_COSTS.group_seconds_per_rank * 7 * RANKS)


def test_the_rungs_differ_only_in_the_parts_they_include() -> None:
    in_process = breakdown(DEFAULT_COSTS, RecoveryLevel.IN_PROCESS, RANKS)
    process = breakdown(DEFAULT_COSTS, RecoveryLevel.PROCESS, RANKS)
    cold = breakdown(DEFAULT_COSTS, RecoveryLevel.PROCESS, RANKS, fork_server=False)
    assert in_process["process_start"] == in_process["warmup"] == 0.0
    assert in_process["stop"] == DEFAULT_COSTS.in_process_stop_seconds
    assert process["process_start"] == DEFAULT_COSTS.fork_start_seconds
    assert cold["process_start"] == DEFAULT_COSTS.cold_start_seconds
    assert process["worker_group"] == 0.0 and process["warmup"] == DEFAULT_COSTS.warmup_seconds
    for parts in (in_process, process, cold):
        assert set(parts) == set(PARTS)
    assert {k: v for k, v in process.items() if k != "process_start"} == {
        k: v for k, v in cold.items() if k != "process_start"
    }


def test_the_state_comes_from_where_the_restart_resumes() -> None:
    memory = breakdown(DEFAULT_COSTS, RecoveryLevel.PROCESS, RANKS, resume="memory")
    peer = breakdown(DEFAULT_COSTS, RecoveryLevel.PROCESS, RANKS, resume="peer")
    assert memory["state"] == 0.0
    assert peer["state"] == pytest.approx(
        DEFAULT_COSTS.state_gb_per_gpu * 8 / DEFAULT_COSTS.network_gbps_per_gpu
    )


def test_every_policy_prices_the_same_event_alike() -> None:
    config = parse_config({"cluster": {"nodes": 2_048, "spares": 40}})
    names = [p.name for p in config.policies]
    assert names == [
        "full-job restart", "torchrun restart", "process restart", "in-process restart",
    ]  # fmt: skip
    pricing = {p.name: config.restart_cost(p) for p in config.policies}
    for level in LEVELS:
        if level is RecoveryLevel.PROCESS:  # torchrun's workers start cold
            continue
        assert len({pricing[n].seconds(level) for n in names}) == 1, level
    assert pricing["torchrun restart"].seconds(RecoveryLevel.PROCESS) > pricing[
        "process restart"
    ].seconds(RecoveryLevel.PROCESS)
    assert pricing["full-job restart"].ranks == (2_048 - 40) * 8


def _one_fault(body: dict[str, Any], kind: str, node: int) -> float:
    """Seconds the job spent restarting after one scripted fault."""
    config = parse_config({"days": 1, **body})
    run = run_job(JobSettings.of(config, 0), script=[Candidate(3_600.0, node, kind, 0)])
    assert sum(run.restarts.values()) == 1
    return run.ledger.lost["restart"]


def test_a_run_charges_each_restart_its_price_and_overrides_win() -> None:
    body: dict[str, Any] = {
        "cluster": {"nodes": 6, "spares": 2},
        "policies": [{"name": "ladder", "recovery": {"levels": ["process", "node", "job"]}}],
    }
    ranks = 4 * 8
    assert _one_fault(body, "network", 1) == pytest.approx(
        price(DEFAULT_COSTS, RecoveryLevel.PROCESS, ranks)
    )
    assert _one_fault(body, "gpu", 1) == pytest.approx(
        price(DEFAULT_COSTS, RecoveryLevel.NODE, ranks)
    )
    # a whole rung's seconds, from the config or the policy, replace the price
    assert _one_fault({**body, "restart_seconds": {"node": 42.0}}, "gpu", 1) == 42.0
    policy = {**body["policies"][0], "restart_seconds": {"node": 7.0}}
    assert _one_fault({**body, "policies": [policy]}, "gpu", 1) == 7.0
    # a part, from the config or the policy, changes the price
    slower = {**body, "costs": {"warmup_seconds": 100.0}}
    assert _one_fault(slower, "network", 1) == pytest.approx(
        price(DEFAULT_COSTS.model_copy(update={"warmup_seconds": 100.0}),
              RecoveryLevel.PROCESS, ranks)
    )  # fmt: skip
    policy = {**body["policies"][0], "costs": {"warmup_seconds": 100.0}}
    assert _one_fault({**body, "policies": [policy]}, "network", 1) == pytest.approx(
        _one_fault(slower, "network", 1)
    )


def test_a_bad_cost_part_is_named() -> None:
    with pytest.raises(ConfigError, match=r"costs\.warmup"):
        parse_config({"cluster": {"nodes": 4}, "costs": {"warmup": 1}})
    with pytest.raises(ConfigError, match=r"policies\[0\]\.costs.*not a cost part: warmup"):
        parse_config({"cluster": {"nodes": 4}, "policies": [{"name": "a", "costs": {"warmup": 1}}]})
    with pytest.raises(ConfigError, match=r"costs\.storage_gbps_per_gpu"):
        parse_config({"cluster": {"nodes": 4}, "costs": {"storage_gbps_per_gpu": 0}})
