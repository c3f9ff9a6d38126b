"""The simulator against the first-order ETTR of one job with exponential failures."""

from __future__ import annotations

from typing import Any

import pytest

from resurge.simulation import analytic_ettr, ettr_approximation, parse_config, simulate
from resurge.simulation.config import SimulationConfig

DETECTION = 30.0
RESTART = 60.0
FAILURES_PER_RUN = 400  # enough that the Monte Carlo noise is well under 1%


def one_job(
    nodes: int, load: float, interval_min: float, write: float, seed: int = 1
) -> SimulationConfig:
    """A job of ``nodes`` nodes whose failures cost ``load`` = N * r_f * dt_cp."""
    interval = interval_min * 60.0
    rate = load / (nodes * interval)  # per node per second
    days = FAILURES_PER_RUN / (nodes * rate) / 86_400.0
    body: dict[str, Any] = {
        "seed": seed,
        "days": days,
        "cluster": {"nodes": nodes, "gpus_per_node": 8},
        "failures": {
            "crash": {
                "per_1000_node_days": rate * 86_400.0 * 1_000.0,
                "scope": "process",
                "detection_seconds": DETECTION,
                "lowest_rung": "process",
            }
        },
        "checkpoint": {"interval_minutes": interval_min, "write_seconds": write},
        "step_seconds": 1.0,
        "restart_seconds": {"process": RESTART},
        "policies": [{"name": "process", "recovery": {"levels": ["process"]}}],
    }
    return parse_config(body)


# N nodes, N * r_f * dt_cp, dt_cp (minutes), w_cp (seconds): where the approximation holds
GRID = [
    (nodes, load, interval, write)
    for nodes in (8, 64)
    for load in (0.02, 0.1)
    for interval, write in ((10.0, 10.0), (60.0, 120.0))
]


@pytest.mark.parametrize(("nodes", "load", "interval", "write"), GRID)
def test_simulated_ettr_matches_the_approximation(
    nodes: int, load: float, interval: float, write: float
) -> None:
    config = one_job(nodes, load, interval, write, seed=nodes)
    simulated = simulate(config).results[0].ettr
    expected = analytic_ettr(config)
    assert abs(simulated - expected) / expected < 0.02, (simulated, expected)


def test_analytic_ettr_is_the_closed_form() -> None:
    config = one_job(8, 0.1, 10.0, 10.0)
    rate = 0.1 / (8 * 600.0)
    assert analytic_ettr(config) == pytest.approx(
        ettr_approximation(8, rate, DETECTION + RESTART, 600.0, 10.0), rel=1e-6
    )


def test_the_approximation_fails_where_failures_are_not_rare() -> None:
    """With N * r_f * dt_cp = 1 a failure comes every checkpoint interval: the first-order
    form counts every loss as if failures never overlapped and is far too pessimistic."""
    config = one_job(8, 1.0, 10.0, 10.0)
    simulated = simulate(config).results[0].ettr
    expected = analytic_ettr(config)
    assert simulated - expected > 0.02
