"""Goodput simulator benchmark: its speed, and what each recovery policy is worth.

For 1,024 nodes x 8 GPUs and 16,384 nodes x 8 GPUs (2% of the nodes left free for
node moves), 30 simulated days, the default failure kinds (6.5 failures per 1,000
node-days, split by Llama 3's causes) and a 30 s checkpoint write, prints for each
policy (a 10-minute full-job restart on every fault; the ladder from the process rung;
the whole ladder from in-process, restart costs as bench/recovery.py measured them)
and for 5- and 30-minute checkpoints: ETTR, the share of time lost by cause, restarts
by rung, and the wall time of the run (goals: under 5 s at 1,024 nodes, under 60 s at
16,384). Then, per policy, the checkpoint interval with the best simulated ETTR over a
sweep, beside Young/Daly's sqrt(2 * w_cp * MTBF) for the job's MTBF.

This is a benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/simulate.py [--quick] [--sweep-days 10] [--plot FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from resurge.simulation import (
    PolicyResult,
    SimulationConfig,
    Summary,
    parse_config,
    young_daly_interval,
)
from resurge.simulation.failures import per_node_second
from resurge.simulation.runner import simulate

WRITE_SECONDS = 30.0
SWEEP_MINUTES = (2, 3, 4, 5, 7, 10, 15, 20, 30, 45, 60)


def config(nodes: int, days: float, interval: float, policy: int | None = None) -> SimulationConfig:
    body: dict[str, Any] = {
        "days": days,
        "seed": 7,
        "cluster": {"nodes": nodes, "gpus_per_node": 8, "spares": nodes // 50},
        "checkpoint": {"interval_minutes": interval, "write_seconds": WRITE_SECONDS},
    }
    made = parse_config(body)
    if policy is not None:
        made = made.model_copy(update={"policies": [made.policies[policy]]})
    return made


def mtbf_seconds(made: SimulationConfig) -> float:
    rate = sum(per_node_second(k, made.failure_rate_scale) for k in made.failures.values())
    return 1.0 / ((made.cluster.nodes - made.cluster.spares) * rate)


def row(result: PolicyResult, seconds: float) -> str:
    held = result.productive_gpu_hours + sum(result.lost_gpu_hours.values())
    lost = " ".join(f"{v / held * 100:5.1f}" for v in result.lost_gpu_hours.values())
    rungs = ", ".join(f"{k} {v}" for k, v in result.restarts.items())
    fails = f"; failed {result.job_failures}x" if result.job_failures else ""
    return (f"  {result.policy:<20} {result.checkpoint_interval_minutes:>4.0f} min  "
            f"{result.ettr:6.3f}  {lost}  {seconds:6.2f} s  {rungs}{fails}")  # fmt: skip


def table(nodes: int, days: float) -> list[PolicyResult]:
    made = config(nodes, days, 5)
    print(f"\n{nodes:,} nodes x 8 GPUs, {days:g} days, job MTBF "
          f"{mtbf_seconds(made) / 60:.1f} min, checkpoint write {WRITE_SECONDS:g} s")  # fmt: skip
    header = "% lost: detect restart redone ckpt wait"
    print(f"  {'policy':<20} {'ckpt':>8}  {'ETTR':>6}  {header:<39}  {'wall':>8}  "
          "restarts by rung")  # fmt: skip
    results = []
    for interval in (5, 30):
        for index in range(3):
            started = time.perf_counter()
            (result,) = simulate(config(nodes, days, interval, index)).results
            print(row(result, time.perf_counter() - started), flush=True)
            results.append(result)
    return results


def sweep(nodes: int, days: float) -> None:
    made = config(nodes, days, 5)
    mtbf = mtbf_seconds(made)
    young_daly = young_daly_interval(WRITE_SECONDS, mtbf) / 60
    print(f"\n{nodes:,} nodes, {days:g} days: best checkpoint interval over "
          f"{', '.join(map(str, SWEEP_MINUTES))} min; Young/Daly sqrt(2 w MTBF) = "
          f"{young_daly:.1f} min")  # fmt: skip
    for index, policy in enumerate(made.policies):
        ettr = {m: simulate(config(nodes, days, m, index)).results[0].ettr for m in SWEEP_MINUTES}
        best = max(ettr, key=lambda m: ettr[m])
        near = min(SWEEP_MINUTES, key=lambda m: abs(m - young_daly))
        print(f"  {policy.name:<20} best {best:>3} min (ETTR {ettr[best]:.3f}); "
              f"at {near} min, nearest Young/Daly: {ettr[near]:.3f}", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1,024 nodes only")
    parser.add_argument(
        "--sweep-days", type=float, default=10.0, help="days per 16,384-node sweep run"
    )
    parser.add_argument("--plot", type=Path, default=None, help="write the 16,384 node plot")
    args = parser.parse_args()
    table(1_024, 30)
    if not args.quick:
        big = table(16_384, 30)
        if args.plot is not None:
            from resurge.simulation import write_plot

            write_plot(Summary(big, {}), args.plot, "16,384 nodes x 8 GPUs, 30 days")
    sweep(1_024, 30)
    if not args.quick:
        sweep(16_384, args.sweep_days)
    return 0


if __name__ == "__main__":
    sys.exit(main())
