"""Goodput simulator benchmark: its speed, and what each recovery policy is worth.

For 1,024 nodes x 8 GPUs and 16,384 nodes x 8 GPUs (2% of the nodes left free for
node moves), 30 simulated days, the default failure kinds (6.5 failures per 1,000
node-days, split by Llama 3's causes) and a 30 s checkpoint write, prints every restart's
price by rung under the cost model (resurge.simulation.costs: the same parts for every
policy), then for each default policy (a restart of the whole job on every fault;
torchrun's cold restart in place; resurge's ladder from the process rung; the whole
ladder from in-process) and for 5- and 30-minute checkpoints: ETTR, the share of time
lost by cause, restarts by rung, and the wall time of the run (goals: under 5 s at 1,024
nodes, under 60 s at 16,384). Then, per policy, the checkpoint interval with the best
simulated ETTR over a sweep, beside Young/Daly's sqrt(2 * w_cp * MTBF) for the job's
MTBF.

Then checkpointless (peer) recovery: the full ladder and the full-job restart, each
with every restart reading the disk checkpoint and with peer recovery (replicated
state, and sharded state with a buddy copy on the next node; snapshots costing
--snapshot-overhead of each step, 100 MB per replica over 10 Gb/s; and both as if a
worker group recreated at the pod or job rung kept its node's snapshots, "kept"), at 5-,
30- and 120-minute disk checkpoints: ETTR, time lost by cause, where recoveries resumed
from (live copies or disk) and the steps each redid (mean, max, max of those resumed
from live copies); and the disk checkpoint interval with the best ETTR for the full
ladder with peer recovery of replicated state.

``--reproduce``: published fleets (Llama 3 405B, ByteRobust, FT-HSDP) simulated from
their own parameters (resurge.simulation.reproduce), the published figure beside the
simulated one and what had to be assumed; then resurge's policies at each scale, every
restart priced by the cost model. ``--sensitivity``: at 2,048 nodes x 8 GPUs (Llama 3's
scale), 30 days, a 15-minute checkpoint, each input of the cost model, the detection
delays, the failure rate and the checkpoint interval and write times 0.5 and 2: the ETTR
of a full-job restart and the gap to it of the in-process ladder, with and without peer
recovery.

``--validate``: the simulator against the first-order ETTR of one job with exponential
failures of one process kind (resurge.simulation.analytic_ettr), over the grid of
tests/unit/test_simulation_validation.py, where the approximation holds, and beyond it
(N r_f dt_cp = 0.3 and 1): each run's error, the largest over the grid.

Every mode but ``--quick`` records what it printed in bench/results/simulate.json
(bench/published.py): the ETTRs, each rung's price and its parts, the shares of time lost
by cause, the wall time of each run and of the mode, and the cost model's measured inputs
(``cost_<field>``) with the run they came from. ``--quick`` records nothing: its figures
would replace the published ones under another command.

``--bad-nodes``: 16,384 nodes x 8 GPUs, a month, 5-minute checkpoints, resurge's whole
ladder, over --seeds seeds: a fleet where 5% of the nodes fail 20 times as often as the
rest by the kinds that count against a node (gpu, host), the fleet's mean rate held at
the uniform fleet's, against the uniform fleet (the baseline, run in the same run with
the same seeds): ETTR with no quarantine (a dry run, which counts what it would have
quarantined), with quarantine, with quarantine and proactive moves (a fifth of gpu
faults announced by warning signs) and with proactive moves alone, as ratios to the
baseline; then the quarantine's settings varied on the fleet with bad nodes.

This is a benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/simulate.py [--quick] [--peer-only] [--snapshot-overhead 0.02]
        [--sweep-days 10] [--plot FILE] [--reproduce] [--sensitivity]
        [--bad-nodes [--seeds 3] [--bad-nodes-days 30]] [--validate]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from published import Figure, record

from resurge.events import RecoveryLevel
from resurge.simulation import (
    PolicyResult,
    SimulationConfig,
    Summary,
    analytic_ettr,
    parse_config,
    young_daly_interval,
)
from resurge.simulation.costs import PARTS, breakdown
from resurge.simulation.defaults import DEFAULT_COSTS, DEFAULT_FAILURES
from resurge.simulation.failures import per_node_second
from resurge.simulation.reproduce import (
    FT_HSDP_RATE_SCALE,
    ft_hsdp_config,
    projection,
    reproduce,
    reproductions,
)
from resurge.simulation.runner import simulate
from resurge.simulation.sensitivity import sensitivity

WRITE_SECONDS = 30.0
SWEEP_MINUTES = (2, 3, 4, 5, 7, 10, 15, 20, 30, 45, 60)
PEER_MINUTES = (5, 30, 120)
CAUSE_HEADER = "% lost: detect restart redone ckpt wait snap"


# What this run printed that the docs quote (bench/published.py), by name.
FIGURES: dict[str, Figure] = {}

_EARLIER = (
    "the cost model's input (shared/resurge/simulation/defaults.py), measured on 2 cores "
    "before the benches recorded results: "
)
MEASURED_INPUTS = {
    "stop_seconds": _EARLIER + "bench/recovery.py --kills 3 --only a,d,e at load 10.6 to "
    "14.7, (a) a process restart 0.64 s less the fork start 0.19 s",
    "in_process_stop_seconds": _EARLIER + "bench/recovery.py --kills 3 --only a,d,e at "
    "load 10.6 to 14.7, (e) an in-process restart",
    "fork_start_seconds": _EARLIER + "bench/forkserver.py --rounds 5 at load 10.5, 4 "
    "workers forked, until all exited, median",
    "cold_start_seconds": _EARLIER + "bench/forkserver.py --rounds 5 at load 10.5, 4 "
    "workers as new interpreters, until all exited, median",
}
"""The cost model's parts measured here, and the run each came from (recorded as
``cost_<field>``; the others are published or assumed, docs/simulation.md cites them)."""

LOST = ("detection", "restart", "redone", "checkpoint", "waiting", "snapshot")
"""The causes of time lost, as a result's ``lost_gpu_hours`` names them."""


def slug(text: str) -> str:
    """A figure name's part: ``in-process restart`` -> ``in_process_restart``."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def config(
    nodes: int,
    days: float,
    interval: float,
    policy: int | None = None,
    peer: dict[str, Any] | None = None,
) -> SimulationConfig:
    body: dict[str, Any] = {
        "days": days,
        "seed": 7,
        "cluster": {"nodes": nodes, "gpus_per_node": 8, "spares": nodes // 50},
        "checkpoint": {"interval_minutes": interval, "write_seconds": WRITE_SECONDS},
    }
    made = parse_config(body)
    if peer is not None:
        body["policies"] = [
            {**p.model_dump(mode="json", exclude_none=True), "peer_recovery": peer}
            for p in made.policies
        ]
        made = parse_config(body)
    if policy is not None:
        made = made.model_copy(update={"policies": [made.policies[policy]]})
    return made


def mtbf_seconds(made: SimulationConfig) -> float:
    rate = sum(per_node_second(k, made.failure_rate_scale) for k in made.failures.values())
    return 1.0 / ((made.cluster.nodes - made.cluster.spares) * rate)


def lost_pct(result: PolicyResult) -> dict[str, float]:
    """The share of the time held each cause lost, in %."""
    held = result.productive_gpu_hours + sum(result.lost_gpu_hours.values())
    return {cause: v / held * 100 for cause, v in result.lost_gpu_hours.items()}


def record_lost(name: str, result: PolicyResult, causes: tuple[str, ...] = LOST) -> None:
    """Record ``result``'s shares of time lost by ``causes`` as ``<name>_<cause>_pct``."""
    for cause, pct in lost_pct(result).items():
        if cause in causes:
            FIGURES[f"{name}_{cause}_pct"] = (round(pct, 2), "%")


def record_inputs() -> None:
    """Record the cost model's measured inputs, each with the run it came from."""
    for field, source in MEASURED_INPUTS.items():
        value = getattr(DEFAULT_COSTS, field)
        record("simulate", {f"cost_{field}": (value, "s")}, conditions=source)


def row(result: PolicyResult, seconds: float) -> str:
    held = result.productive_gpu_hours + sum(result.lost_gpu_hours.values())
    lost = " ".join(f"{v / held * 100:5.1f}" for v in result.lost_gpu_hours.values())
    rungs = ", ".join(f"{k} {v}" for k, v in result.restarts.items())
    fails = f"; failed {result.job_failures}x" if result.job_failures else ""
    return (f"  {result.policy:<20} {result.checkpoint_interval_minutes:>4.0f} min  "
            f"{result.ettr:6.3f}  {lost}  {seconds:6.2f} s  {rungs}{fails}")  # fmt: skip


def prices(made: SimulationConfig) -> None:
    """Each rung's price from the disk checkpoint, part by part, under the cost model."""
    ranks = (made.cluster.nodes - made.cluster.spares) * made.cluster.gpus_per_node
    print(f"  restart prices at {ranks:,} ranks, seconds ({', '.join(PARTS)}; "
          "fork server, or cold):")  # fmt: skip
    for level in RecoveryLevel:
        parts = breakdown(made.costs, level, ranks)
        cold = sum(breakdown(made.costs, level, ranks, fork_server=False).values())
        shown = " + ".join(f"{v:.2f}" for v in parts.values())
        print(f"    {level.value:<10} {sum(parts.values()):7.1f} = {shown}; cold {cold:.1f}")
        tag = f"price_{made.cluster.nodes}_nodes"
        FIGURES[f"{tag}_{level.value}_s"] = (round(sum(parts.values()), 2), "s")
        FIGURES[f"{tag}_{level.value}_cold_s"] = (round(cold, 2), "s")
        for part in ("group", "state"):  # the same at every rung
            FIGURES[f"{tag}_{part}_s"] = (round(parts[part], 2), "s")


def table(nodes: int, days: float) -> list[PolicyResult]:
    made = config(nodes, days, 5)
    print(f"\n{nodes:,} nodes x 8 GPUs, {days:g} days, job MTBF "
          f"{mtbf_seconds(made) / 60:.1f} min, checkpoint write {WRITE_SECONDS:g} s")  # fmt: skip
    prices(made)
    header = CAUSE_HEADER
    print(f"  {'policy':<20} {'ckpt':>8}  {'ETTR':>6}  {header:<45}  {'wall':>8}  "
          "restarts by rung")  # fmt: skip
    results = []
    walls = []
    for interval in (5, 30):
        for index in range(len(made.policies)):
            started = time.perf_counter()
            (result,) = simulate(config(nodes, days, interval, index)).results
            walls.append(time.perf_counter() - started)
            print(row(result, walls[-1]), flush=True)
            results.append(result)
            name = f"ettr_{nodes}_nodes_{interval}min_{slug(result.policy)}"
            FIGURES[name] = (round(result.ettr, 3), "")
            record_lost(f"lost_{nodes}_nodes_{interval}min_{slug(result.policy)}", result)
    FIGURES[f"wall_{nodes}_nodes_{days:g}d_run_min_s"] = (round(min(walls), 2), "s")
    FIGURES[f"wall_{nodes}_nodes_{days:g}d_run_max_s"] = (round(max(walls), 2), "s")
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


def peer_variants(overhead: float) -> list[tuple[str, dict[str, Any] | None]]:
    """Disk recovery, and peer recovery of replicated and sharded state; the last two
    also as if a recreated worker group kept its node's snapshots ("kept")."""
    base: dict[str, Any] = {"snapshot_overhead": overhead}
    kept = {**base, "recreated_groups_keep_memory": True}
    return [
        ("disk", None),
        ("peer, replicated", base),
        ("peer, sharded", {**base, "state": "sharded"}),
        ("peer, repl., kept", kept),
        ("peer, shard., kept", {**kept, "state": "sharded"}),
    ]


def peer_table(nodes: int, days: float, overhead: float) -> None:
    made = config(nodes, days, 5)
    mtbf = mtbf_seconds(made) / 60
    print(f"\n{nodes:,} nodes x 8 GPUs, {days:g} days, job MTBF {mtbf:.1f} min: peer "
          f"recovery (snapshots {overhead:.1%} of each step) against the disk")  # fmt: skip
    print(f"  {'policy':<19} {'recovery':<18} {'ckpt':>7}  {'ETTR':>5}  {CAUSE_HEADER:<44}  "
          "resumed live/disk; steps redone: mean, max, max live")  # fmt: skip
    full, whole = 0, len(made.policies) - 1
    for interval in PEER_MINUTES:
        for index in (whole, full):
            for name, peer in peer_variants(overhead):
                (result,) = simulate(config(nodes, days, interval, index, peer)).results
                held = result.productive_gpu_hours + sum(result.lost_gpu_hours.values())
                lost = " ".join(f"{v / held * 100:5.1f}" for v in result.lost_gpu_hours.values())
                live, disk = result.resumes.get("live", 0), result.resumes.get("disk", 0)
                redone = result.steps_redone
                live_max = f"{redone['max_live']:.2f}" if "max_live" in redone else "-"
                key = f"peer_ettr_{nodes}_nodes_{interval}min_{slug(result.policy)}_{slug(name)}"
                FIGURES[key] = (round(result.ettr, 3), "")
                if "sharded" not in name and "shard." not in name:
                    lost_key = key.replace("peer_ettr_", "peer_lost_", 1)
                    record_lost(lost_key, result, ("restart", "redone", "snapshot"))
                print(f"  {result.policy:<19} {name:<18} {interval:>3} min  {result.ettr:5.3f}  "
                      f"{lost:<44}  {live:,}/{disk:,}; {redone.get('mean', 0):.2f}, "
                      f"{redone.get('max', 0):.0f}, {live_max}", flush=True)  # fmt: skip
    minutes = (*SWEEP_MINUTES, 90, 120, 180)
    peer = {"snapshot_overhead": overhead}
    ettr = {m: simulate(config(nodes, days, m, whole, peer)).results[0].ettr for m in minutes}
    best = max(ettr, key=lambda m: ettr[m])
    print(f"  in-process restart, peer, replicated: best checkpoint interval over "
          f"{', '.join(map(str, minutes))} min: {best} min (ETTR {ettr[best]:.3f})")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1,024 nodes only")
    parser.add_argument(
        "--sweep-days", type=float, default=10.0, help="days per 16,384-node sweep run"
    )
    parser.add_argument("--plot", type=Path, default=None, help="write the 16,384 node plot")
    parser.add_argument("--peer-only", action="store_true", help="only the peer recovery tables")
    parser.add_argument(
        "--reproduce", action="store_true", help="only the published fleets and projections"
    )
    parser.add_argument(
        "--sensitivity", action="store_true", help="only the inputs' sensitivity table"
    )
    parser.add_argument(
        "--bad-nodes", action="store_true", help="only the bad nodes, quarantine and moves tables"
    )
    parser.add_argument("--seeds", type=int, default=3, help="--bad-nodes: seeds 1 to this")
    parser.add_argument(
        "--bad-nodes-days", type=float, default=30.0, help="--bad-nodes: simulated days"
    )
    parser.add_argument(
        "--validate", action="store_true", help="only the simulator against the approximation"
    )
    parser.add_argument(
        "--snapshot-overhead",
        type=float,
        default=0.02,
        help="peer recovery: the snapshots' cost, a share of each step (default 0.02)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    if args.bad_nodes:
        bad_nodes(16_384, args.bad_nodes_days, range(1, args.seeds + 1))
        return finish(started, "")
    if args.reproduce or args.sensitivity or args.validate:
        modes = {"reproduce": published, "sensitivity": inputs, "validate": validate}
        for name, mode in modes.items():
            if getattr(args, name):
                began = time.perf_counter()
                mode()
                FIGURES[f"wall_{name}_s"] = (round(time.perf_counter() - began, 1), "s")
        return finish(started, "")
    if not args.peer_only:
        tables(args.quick, args.sweep_days, args.plot)
    peer_table(1_024, 30, args.snapshot_overhead)
    if not args.quick:
        peer_table(16_384, 30, args.snapshot_overhead)
    name = "quick" if args.quick else "peer_only" if args.peer_only else "default"
    return finish(started, name, recorded=not args.quick)


def finish(started: float, mode: str, *, recorded: bool = True) -> int:
    """Print the wall time; record it (as ``wall_<mode>_s`` where ``mode`` is given),
    this run's figures and the cost model's measured inputs, unless not ``recorded``."""
    wall = time.perf_counter() - started
    print(f"\nwall time {wall:.1f} s")
    if not recorded:
        print("--quick: nothing recorded")
        return 0
    if mode:
        FIGURES[f"wall_{mode}_s"] = (round(wall, 1), "s")
    record_inputs()
    print(f"recorded in {record('simulate', FIGURES)}")
    return 0


def published() -> None:
    """Each published fleet against its simulation, then resurge's policies there."""
    print("\nPublished fleets, simulated from their own parameters (ETTR, %):")
    print(f"  {'fleet':<52} {'published':>9} {'simulated':>9}  wall  assumed")
    seen: list[tuple[int, float]] = []
    for item in reproductions():
        started = time.perf_counter()
        ettr = reproduce(item)
        FIGURES[f"reproduced_{slug(item.name)}_pct"] = (round(ettr * 100, 1), "%")
        FIGURES[f"published_{slug(item.name)}_pct"] = (round(item.published * 100, 1), "%")
        print(f"  {item.name:<52} {item.bound}{item.published * 100:7.0f} {ettr * 100:9.1f}  "
              f"{time.perf_counter() - started:4.1f}  {'; '.join(item.assumed)}")  # fmt: skip
    days = reproductions()[-1].config.days
    print(f"  FT-HSDP's two runs at other failure rates (x RSC-1's 6.5; the table's: "
          f"x{FT_HSDP_RATE_SCALE:g}):")  # fmt: skip
    for scale in (1.0, 1.4, 1.5, 1.55):
        pair = [simulate(ft_hsdp_config(days, stall, scale)).results[0].ettr for stall in (10, 3)]
        print(f"    x{scale:<5g} {pair[0] * 100:5.1f} and {pair[1] * 100:5.1f}", flush=True)
        for stall, ettr in zip((10, 3), pair, strict=True):
            FIGURES[f"ft_hsdp_rate_x{slug(f'{scale:g}')}_{stall}min_stalls_pct"] = (
                round(ettr * 100, 1), "%")  # fmt: skip
    print("\nresurge's policies at the same scales, every restart priced by the cost model:")
    for item in reproductions():
        made = projection(item)
        where = (made.cluster.nodes, made.failure_rate_scale)
        if where in seen:
            continue
        seen.append(where)
        started = time.perf_counter()
        results = simulate(made).results
        ranks = (made.cluster.nodes - made.cluster.spares) * made.cluster.gpus_per_node
        print(f"  {item.fleet}'s scale: {ranks:,} GPUs, {made.days:g} days, "
              f"checkpoint every {made.checkpoint.interval_minutes:g} min "
              f"({time.perf_counter() - started:.1f} s)")  # fmt: skip
        for r in results:
            lost = ", ".join(f"{cause} {pct:.1f}" for cause, pct in lost_pct(r).items())
            print(f"    {r.policy:<20} ETTR {r.ettr:.3f}; % lost: {lost}")
            FIGURES[f"projected_{slug(item.fleet)}_{slug(r.policy)}"] = (round(r.ettr, 3), "")
            record_lost(f"projected_{slug(item.fleet)}_{slug(r.policy)}", r,
                        ("restart", "redone", "checkpoint"))  # fmt: skip


def inputs() -> None:
    """The sensitivity table: each input x0.5 and x2, the gaps to a full-job restart."""
    made = parse_config({
        "days": 30, "seed": 7, "cluster": {"nodes": 2_048 + 40, "spares": 40},
        "checkpoint": {"interval_minutes": 15, "write_seconds": WRITE_SECONDS},
        "policies": [
            {"name": "full-job restart", "recovery": {"levels": ["job"]}},
            {"name": "in-process restart"},
            {"name": "in-process + peer", "peer_recovery": {}},
        ],
    })  # fmt: skip
    print(
        "\nSensitivity, 2,048 nodes x 8 GPUs, 30 days, 15-minute checkpoints: full-job "
        "restart's ETTR, and the in-process ladder's gap to it without / with peer recovery"
    )
    print(f"  {'input':<24} {'value':>10}   {'x0.5':^22}   {'as given':^22}   {'x2':^22}")
    for row in sensitivity(made):
        cells = []
        for factor in (0.5, 1.0, 2.0):
            full = row.ettr[factor]["full-job restart"]
            ladder = row.gap(factor, "in-process restart", "full-job restart")
            peer = row.gap(factor, "in-process + peer", "full-job restart")
            cells.append(f"{full:.3f} {ladder:+.3f} {peer:+.3f}")
        print(f"  {row.name:<24} {row.value:10.4g}   " + "   ".join(cells), flush=True)


VALIDATION_GRID = [
    (nodes, load, interval, write)
    for nodes in (8, 64)
    for load in (0.02, 0.1)
    for interval, write in ((10.0, 10.0), (60.0, 120.0))
]
"""N nodes, N r_f dt_cp, dt_cp (minutes), w_cp (seconds): tests/unit/
test_simulation_validation.py's grid, where the approximation holds."""


def one_job(nodes: int, load: float, interval: float, write: float, seed: int) -> SimulationConfig:
    """The validation test's job: one process kind whose failures cost ``load`` = N r_f
    dt_cp, detection 30 s and a 60 s restart (u0 = 90 s), about 400 failures a run."""
    rate = load / (nodes * interval * 60.0)  # per node per second
    return parse_config({
        "seed": seed, "days": 400 / (nodes * rate) / 86_400.0,
        "cluster": {"nodes": nodes, "gpus_per_node": 8},
        "failures": {"crash": {"per_1000_node_days": rate * 86_400.0 * 1_000.0,
                               "scope": "process", "detection_seconds": 30.0,
                               "lowest_rung": "process"}},
        "checkpoint": {"interval_minutes": interval, "write_seconds": write},
        "step_seconds": 1.0, "restart_seconds": {"process": 60.0},
        "policies": [{"name": "process", "recovery": {"levels": ["process"]}}],
    })  # fmt: skip


def validate() -> None:
    """Each run's simulated ETTR against the approximation, in the grid and beyond it."""
    print("\nValidation: one job, exponential failures of one process kind, u0 = 90 s, about "
          "400 failures a run; error = |simulated - approximation| / approximation")  # fmt: skip
    print(f"  {'N':>3} {'N r_f dt_cp':>11} {'dt_cp':>7} {'w_cp':>6}  {'simulated':>9} "
          f"{'approx.':>8} {'error':>7}")  # fmt: skip
    errors = []
    beyond = [(8, 0.3, 10.0, 10.0), (8, 1.0, 10.0, 10.0)]
    for nodes, load, interval, write in [*VALIDATION_GRID, *beyond]:
        made = one_job(nodes, load, interval, write, seed=1 if load > 0.1 else nodes)
        simulated, expected = simulate(made).results[0].ettr, analytic_ettr(made)
        error = abs(simulated - expected) / expected * 100
        print(f"  {nodes:>3} {load:>11g} {interval:>4g} min {write:>4g} s  {simulated:9.3f} "
              f"{expected:8.3f} {error:6.2f}%", flush=True)  # fmt: skip
        if (nodes, load, interval, write) in beyond:
            tag = f"validation_load_{slug(f'{load:g}')}"
            FIGURES[f"{tag}_error_pct"] = (round(error, 2), "%")
            FIGURES[f"{tag}_simulated"] = (round(simulated, 3), "")
            FIGURES[f"{tag}_approximation"] = (round(expected, 3), "")
        else:
            errors.append(error)
    print(f"  largest error over the grid: {max(errors):.2f}%")
    FIGURES["validation_grid_max_error_pct"] = (round(max(errors), 2), "%")


BAD_FRACTION = 0.05
BAD_MULTIPLIER = 20.0
PREDICTABLE_GPU = 0.2
BAD_POLICIES: list[dict[str, Any]] = [
    {"name": "no quarantine", "quarantine": {"dry_run": True}},
    {"name": "quarantine", "quarantine": {}},
    {"name": "quarantine + proactive moves", "quarantine": {}, "proactive_moves": True},
    {"name": "proactive moves", "proactive_moves": True},
]
"""The policies of the bad-nodes table: resurge's whole ladder (the job spec's default
recovery), with the quarantine's default settings (no quarantine is its dry run)."""

QUARANTINE_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("threshold 1 (every fault)", {"threshold": 1.0}),
    ("threshold 1.5 (default)", {}),
    ("threshold 2.5", {"threshold": 2.5}),
    ("threshold 2.5, half-life 24 h", {"threshold": 2.5, "half_life_hours": 24.0}),
    ("never fixed", {"fixed_probability": 0.0}),
    ("always fixed", {"fixed_probability": 1.0}),
    ("out 24 h, not 72 h", {"hours": 24.0}),
]
"""The quarantine's settings varied, each over the defaults."""


def fleet_config(
    nodes: int, days: float, seed: int, bad: bool, policies: list[dict[str, Any]]
) -> SimulationConfig:
    """The bad-nodes table's config: ``bad``: 5% of the nodes fail 20x as often (mean
    held); a fifth of gpu faults announced by warning signs."""
    failures = {name: dict(kind) for name, kind in DEFAULT_FAILURES.items()}
    failures["gpu"]["predictable_fraction"] = PREDICTABLE_GPU
    cluster: dict[str, Any] = {"nodes": nodes, "gpus_per_node": 8, "spares": nodes // 50}
    if bad:
        cluster["bad_nodes"] = {"fraction": BAD_FRACTION, "rate_multiplier": BAD_MULTIPLIER}
    return parse_config({
        "days": days, "seed": seed, "cluster": cluster, "failures": failures,
        "checkpoint": {"interval_minutes": 5, "write_seconds": WRITE_SECONDS},
        "policies": policies,
    })  # fmt: skip


def fleet_runs(
    nodes: int, days: float, seeds: range, bad: bool, policies: list[dict[str, Any]]
) -> tuple[dict[str, list[PolicyResult]], float]:
    """Each policy's results over ``seeds``; the longest wall time of one policy's run."""
    out: dict[str, list[PolicyResult]] = {p["name"]: [] for p in policies}
    slowest = 0.0
    for seed in seeds:
        started = time.perf_counter()
        for result in simulate(fleet_config(nodes, days, seed, bad, policies)).results:
            out[result.policy].append(result)
        slowest = max(slowest, (time.perf_counter() - started) / len(policies))
    return out, slowest


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


COUNTS = ("attributed_faults", "on_bad_nodes", "quarantines", "quarantined_bad",
          "returned_fixed", "would_quarantine", "planned_moves")  # fmt: skip


def fleet_row(
    prefix: str, fleet: str, policy: str, results: list[PolicyResult], baseline: list[float]
) -> str:
    """One row of the bad-nodes table; records its figures, named from ``prefix``."""
    tag = f"{prefix}_{slug(fleet)}_{slug(policy)}"
    ettr = [r.ettr for r in results]
    ratio = mean(ettr) / mean(baseline)
    per_seed = [e / b for e, b in zip(ettr, baseline, strict=True)]
    hit = mean([float(sum(r.faults.values())) for r in results])
    n = {k: mean([float(r.nodes.get(k, 0)) for r in results]) for k in COUNTS}
    share = n["on_bad_nodes"] / n["attributed_faults"]
    held = n["would_quarantine"] or n["quarantines"]
    would = " (would)" if n["would_quarantine"] else ""
    FIGURES[f"{tag}_ettr"] = (round(mean(ettr), 3), "")
    FIGURES[f"{tag}_ratio"] = (round(ratio, 3), "x")
    if fleet != "uniform" and policy == "no quarantine":
        FIGURES[f"{prefix}_attributed_on_bad_nodes_pct"] = (round(share * 100, 1), "%")
        FIGURES[f"{prefix}_would_quarantine"] = (round(held), "")
    return (
        f"  {fleet:<8} {policy:<29} {mean(ettr):6.3f} {ratio:6.3f} "
        f"{min(per_seed):6.3f}-{max(per_seed):.3f}  {hit:,.0f}; {share:.0%}; {held:,.0f}{would} "
        f"({n['quarantined_bad']:,.0f}, {n['returned_fixed']:,.0f}); {n['planned_moves']:,.0f}"
    )


def bad_nodes(nodes: int, days: float, seeds: range) -> None:
    """The bad-nodes table, then the quarantine's settings varied (the module)."""
    tag = f"bad_nodes_{nodes}_nodes_{days:g}d"
    print(
        f"\nBad nodes: {nodes:,} nodes x 8 GPUs, {days:g} days, 5-minute checkpoints, the "
        f"whole ladder, seeds {seeds.start}-{seeds.stop - 1}; {BAD_FRACTION:.0%} of the nodes "
        f"fail {BAD_MULTIPLIER:g}x as often by gpu and host faults (the fleet's mean held), "
        f"{PREDICTABLE_GPU:.0%} of gpu faults announced"
    )
    print(
        f"  {'fleet':<8} {'policy':<29} {'ETTR':>6} {'ratio':>6} {'per seed':>13}  faults hit "
        "job; attributed on bad nodes; quarantined (bad, fixed); planned moves"
    )
    runs: dict[str, dict[str, list[PolicyResult]]] = {}
    for fleet, bad in (("uniform", False), ("5% bad", True)):
        runs[fleet], slowest = fleet_runs(nodes, days, seeds, bad, BAD_POLICIES)
        count = runs[fleet]["no quarantine"][0].nodes["bad_nodes"]
        print(f"  ({fleet}: {count:,} bad nodes; {slowest:.1f} s a run at most)", flush=True)
    baseline = [r.ettr for r in runs["uniform"]["no quarantine"]]
    FIGURES[f"{tag}_uniform_ettr"] = (round(mean(baseline), 3), "")
    for fleet, by_policy in runs.items():
        for policy, results in by_policy.items():
            print(fleet_row(tag, fleet, policy, results, baseline), flush=True)
    unquarantined = mean([r.ettr for r in runs["5% bad"]["no quarantine"]])
    print(
        "\n  Quarantine's settings (over threshold 1.5, half-life 168 h, out 72 h, fixed with "
        "probability 0.5), 5% bad: ETTR, ratio to no quarantine on the same fleet"
    )
    variants = [{"name": n, "quarantine": q} for n, q in QUARANTINE_VARIANTS]
    swept, _ = fleet_runs(nodes, days, seeds, True, variants)
    for name, results in swept.items():
        ettr = mean([r.ettr for r in results])
        quarantines = mean([float(r.nodes.get("quarantines", 0)) for r in results])
        on_bad = mean([float(r.nodes.get("quarantined_bad", 0)) for r in results])
        print(
            f"    {name:<30} {ettr:6.3f} {ettr / unquarantined:6.3f}  quarantined "
            f"{quarantines:,.0f} ({on_bad:,.0f} bad)",
            flush=True,
        )
        FIGURES[f"{tag}_quarantine_{slug(name)}_ratio"] = (round(ettr / unquarantined, 3), "x")


def tables(quick: bool, sweep_days: float, plot: Path | None) -> None:
    table(1_024, 30)
    if not quick:
        big = table(16_384, 30)
        if plot is not None:
            from resurge.simulation import write_plot

            write_plot(Summary(big, {}), plot, "16,384 nodes x 8 GPUs, 30 days")
    sweep(1_024, 30)
    if not quick:
        sweep(16_384, sweep_days)


if __name__ == "__main__":
    sys.exit(main())
