"""Run every policy of a config and sum each run up as a :class:`.PolicyResult`.

:func:`simulate` is the Python API behind ``resurge simulate``: without a trace, one
fixed-size job per policy (:mod:`.single_job`); with one, the trace per policy
(:mod:`.trace_run`). Every policy meets the same failure candidates (one seed). The
result is deterministic for a given config.
"""

from __future__ import annotations

from collections import Counter

from resurge.simulation.analytic import ettr_approximation
from resurge.simulation.config import SimulationConfig
from resurge.simulation.failures import per_node_second
from resurge.simulation.results import CAUSES, Ledger, PolicyResult, Summary
from resurge.simulation.single_job import JobRun, JobSettings, run_job
from resurge.simulation.trace_run import run_trace

__all__ = ["analytic_ettr", "simulate"]


def _gpu_hours(ledger: Ledger, gpus: float) -> dict[str, float]:
    return {cause: round(ledger.lost[cause] * gpus / 3600.0, 3) for cause in CAUSES}


def _steps_redone(run: JobRun, step: float) -> dict[str, float]:
    redone = [seconds for _, seconds in run.recoveries]
    if not redone:
        return {}
    mean = sum(redone) / len(redone)
    steps = {"mean": round(mean / step, 3), "max": round(max(redone) / step, 3)}
    live = [seconds for origin, seconds in run.recoveries if origin == "live"]
    if live:
        steps["max_live"] = round(max(live) / step, 3)
    return steps


def _job_results(config: SimulationConfig) -> list[PolicyResult]:
    results = []
    wall = config.days * 86_400.0
    for index, policy in enumerate(config.policies):
        settings = JobSettings.of(config, index)
        run = run_job(settings)
        peer = settings.peer
        step = settings.step_seconds * (1.0 + (peer.snapshot_overhead if peer else 0.0))
        gpus = run.replicas * config.cluster.gpus_per_node
        checkpoint = config.checkpoint_of(policy)
        results.append(
            PolicyResult(
                policy=policy.name,
                mode="job",
                days=config.days,
                gpus=gpus,
                ettr=round(run.ledger.productive / wall, 5),
                lost_gpu_hours=_gpu_hours(run.ledger, gpus),
                productive_gpu_hours=round(run.ledger.productive * gpus / 3600.0, 3),
                restarts=dict(sorted(run.restarts.items())),
                faults=dict(sorted(run.faults.items())),
                job_failures=run.job_failures,
                resumes=dict(sorted(Counter(origin for origin, _ in run.recoveries).items())),
                steps_redone=_steps_redone(run, step),
                nodes=dict(sorted(run.nodes.items())),
                checkpoint_interval_minutes=checkpoint.interval_minutes,
                checkpoint_write_seconds=checkpoint.write_seconds,
            )
        )
    return results


def _trace_results(config: SimulationConfig) -> list[PolicyResult]:
    results = []
    gpus = config.cluster.nodes * config.cluster.gpus_per_node
    for policy in config.policies:
        run = run_trace(config, policy)
        checkpoint = config.checkpoint_of(policy)
        results.append(
            PolicyResult(
                policy=policy.name,
                mode="trace",
                days=config.days,
                gpus=gpus,
                ettr=round(run.ledger.productive / run.held, 5) if run.held else 0.0,
                lost_gpu_hours=_gpu_hours(run.ledger, 1.0),
                productive_gpu_hours=round(run.ledger.productive / 3600.0, 3),
                restarts={},
                faults=dict(sorted(run.faults.items())),
                checkpoint_interval_minutes=checkpoint.interval_minutes,
                checkpoint_write_seconds=checkpoint.write_seconds,
                used_gpu_hours=round(run.held / 3600.0, 3),
                resizes=run.resizes,
            )
        )
    fixed = [r for r, p in zip(results, config.policies, strict=True) if not p.elastic]
    if fixed and fixed[0].used_gpu_hours is not None:
        idle = gpus * config.days * 24.0 - fixed[0].used_gpu_hours
        for result, policy in zip(results, config.policies, strict=True):
            if policy.elastic and result.used_gpu_hours is not None and idle > 0:
                gained = result.used_gpu_hours - fixed[0].used_gpu_hours
                result.idle_capacity_used = round(gained / idle, 4)
    return results


def _settings(config: SimulationConfig) -> dict[str, object]:
    rate = sum(per_node_second(k, config.failure_rate_scale) for k in config.failures.values())
    nodes = config.cluster.nodes - (0 if config.trace else config.cluster.spares)
    settings: dict[str, object] = {
        "seed": config.seed,
        "days": config.days,
        "nodes": config.cluster.nodes,
        "gpus_per_node": config.cluster.gpus_per_node,
        "spares": config.cluster.spares,
        "failures_per_1000_node_days": round(rate * 86_400_000.0, 4),
        "mtbf_hours": round(1.0 / (nodes * rate) / 3600.0, 4) if rate else None,
        "costs": config.costs.model_dump(),
        "restart_seconds": {k.value: v for k, v in config.restart_seconds.items()},
    }
    return settings


def simulate(config: SimulationConfig) -> Summary:
    """Every policy of ``config``, simulated; a :class:`.Summary` of the results."""
    results = _trace_results(config) if config.trace else _job_results(config)
    return Summary(results=results, settings=_settings(config))


def analytic_ettr(config: SimulationConfig, policy_index: int = 0) -> float:
    """The first-order ETTR (:func:`.ettr_approximation`) of ``config``'s single job
    under policy ``policy_index`` when every failure costs its detection plus the
    restart seconds of its kind's lowest rung and every restart resumes from the disk
    (a policy's ``peer_recovery`` is not in the approximation)."""
    settings = JobSettings.of(config, policy_index)
    rates = {n: per_node_second(k, config.failure_rate_scale) for n, k in config.failures.items()}
    total = sum(rates.values())
    if total == 0:
        return 1.0 / (1.0 + settings.write / settings.interval)
    overhead = (
        sum(
            rates[n] * (k.detection_seconds + settings.pricing.seconds(k.lowest_rung))
            for n, k in config.failures.items()
        )
        / total
    )
    replicas = config.cluster.nodes - config.cluster.spares
    return ettr_approximation(replicas, total, overhead, settings.interval, settings.write)
