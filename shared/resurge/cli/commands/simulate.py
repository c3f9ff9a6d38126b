"""``resurge simulate CONFIG``: the goodput simulator from the command line.

Needs no cluster. Prints one line per policy (ETTR, GPU-hours lost by cause, restarts by
rung) and, with ``--out DIR``, writes ``DIR/summary.json`` and ``DIR/goodput.png``.
Exit status 0; 2, naming the field, for a config that cannot be read or used, or when
the plot is asked for without matplotlib.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``simulate`` with the ``resurge`` subcommands."""
    simulate = commands.add_parser(
        "simulate",
        help="simulate recovery and elastic policies on a large cluster with failures",
        description="Simulate a cluster whose nodes and processes fail at published rates "
        "and compare policies by effective training time ratio (ETTR) and GPU-hours lost "
        "by cause, deciding every recovery and resize with the restarter's and scaler's "
        "own code. Needs no cluster. docs/simulation.md lists the config fields.",
    )
    simulate.add_argument("config", type=Path, help="the simulation config (YAML)")
    simulate.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write summary.json and goodput.png (needs matplotlib) into DIR",
    )
    simulate.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``args.config``; the exit status."""
    from resurge.simulation import ConfigError, MissingPlotting, load_config, simulate
    from resurge.simulation.plot import write_plot

    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"resurge simulate: {error}", file=sys.stderr)
        return 2
    summary = simulate(config)
    print(f"{'policy':<24} {'ETTR':>7}  GPU-hours lost by cause; restarts by rung")
    for r in summary.results:
        lost = ", ".join(f"{k} {v:,.0f}" for k, v in r.lost_gpu_hours.items())
        rungs = ", ".join(f"{k} {v}" for k, v in r.restarts.items()) or "-"
        print(f"{r.policy:<24} {r.ettr:>7.4f}  {lost}; {rungs}")
    if args.out is None:
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    print(summary.write(args.out / "summary.json"))
    try:
        print(write_plot(summary, args.out / "goodput.png", title=args.config.stem))
    except MissingPlotting as error:
        print(f"resurge simulate: {error}", file=sys.stderr)
        return 2
    return 0
