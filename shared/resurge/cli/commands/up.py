"""``resurge up``: start a local cluster in the state folder."""

from __future__ import annotations

import argparse
from typing import Any

from resurge.cli.arguments import positive

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``up``."""
    up = commands.add_parser("up", help="start a local cluster: NATS, the services, N nodes")
    up.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="virtual nodes (default: the nodes of this folder's earlier run, those added "
        "by `resurge node add` included, else 2); given, that many fresh nodes",
    )
    up.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="simulated GPUs per node (default 2; given, fresh nodes as with --nodes)",
    )
    up.add_argument("--port", type=int, default=0, help="NATS port (default: a free one)")
    up.add_argument(
        "--nats-cluster",
        type=positive,
        default=1,
        metavar="N",
        help="run N NATS servers as one cluster (3 or 5; streams and buckets keep 3 copies, "
        "so one server may die without losing a message); default 1",
    )
    up.add_argument(
        "--foreground", action="store_true", help="stay attached; Ctrl-C stops the cluster"
    )
    up.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Start the cluster; the exit status."""
    from resurge.local.state import resolve_state_dir
    from resurge.local.updown import up

    return up(
        resolve_state_dir(args.state_dir),
        args.nodes,
        args.gpus_per_node,
        args.port,
        args.foreground,
        args.nats_cluster,
    )
