"""``resurge-node-agent``: command line of the node agent."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from resurge.runtime.service import ServiceContext, run_service
from resurge.runtime.settings import Settings
from resurge_node_agent.launcher import LaunchAgent, LaunchConfig
from resurge_node_agent.monitor import MonitorConfig, NodeMonitor

__all__ = ["main"]

# Kubernetes passes the node name through the downward API under this name.
NODE_NAME = "NODE_NAME"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resurge-node-agent",
        description=(
            "The resurge node agent. In 'launch' mode it runs one replica of a training "
            "job: it waits for an Assign command, starts the workers with torchrun's "
            "environment, publishes their output, starts and exits as events, and obeys "
            "Stop and new Assign commands. In 'monitor' mode (one per node) it reports "
            "the node and starts a launch agent for each worker group placed on it. "
            "Connection settings come from RESURGE_* "
            "environment variables (RESURGE_NATS_URL, RESURGE_NAMESPACE, ...)."
        ),
    )
    modes = parser.add_subparsers(dest="mode", required=True)
    launch = modes.add_parser(
        "launch",
        help="run one replica's workers",
        description="Run one replica's workers: resurge-node-agent launch --job J "
        "--replica R --nproc-per-node N -- python train.py ...",
    )
    launch.add_argument("--job", required=True, help="training job name")
    launch.add_argument("--replica", type=int, required=True, help="replica index (0-based)")
    launch.add_argument(
        "--nproc-per-node", type=int, default=1, help="worker processes to start (default 1)"
    )
    launch.add_argument(
        "--node",
        default=os.environ.get(NODE_NAME) or socket.gethostname(),
        help="node name reported in events (default: $NODE_NAME or the host name)",
    )
    launch.add_argument("--working-dir", default=None, help="folder the workers start in")
    launch.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra worker environment variable (repeatable)",
    )
    launch.add_argument(
        "--stop-grace-seconds",
        type=float,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL when stopping workers (default 10)",
    )
    launch.add_argument(
        "--no-fork-server",
        action="store_true",
        help="start every worker as a new process instead of forking a pre-warmed server",
    )
    launch.add_argument(
        "--preload",
        default="torch,torch._dynamo,torch.distributed.checkpoint",
        metavar="MODULES",
        help="comma-separated modules the fork server imports once (default: torch, "
        "torch._dynamo, torch.distributed.checkpoint)",
    )
    launch.add_argument(
        "--incarnation",
        type=int,
        default=0,
        help="how many times this replica's worker group was recreated (default 0)",
    )
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- then the worker's argv")
    monitor = modes.add_parser(
        "monitor",
        help="report one node and run the worker groups placed on it",
        description="Report one node (slots, health) and run the worker groups the scaler "
        "places on it: one 'launch' agent per (job, replica).",
    )
    monitor.add_argument(
        "--node",
        default=os.environ.get(NODE_NAME) or socket.gethostname(),
        help="node name (default: $NODE_NAME or the host name)",
    )
    monitor.add_argument(
        "--gpus", type=int, default=1, help="GPUs (simulated slots in local mode) on the node"
    )
    monitor.add_argument(
        "--address", default="127.0.0.1", help="address other nodes reach this one at"
    )
    monitor.add_argument(
        "--log-dir", type=Path, default=None, help="write each launch agent's output here"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.mode == "monitor":
        return _monitor(args)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        _parser().error("launch needs the worker command after --")
    if args.replica < 0 or args.nproc_per_node < 1:
        _parser().error("--replica must be >= 0 and --nproc-per-node >= 1")
    bad = [item for item in args.env if "=" not in item or item.startswith("=")]
    if bad:
        _parser().error(f"--env takes NAME=VALUE, got {bad[0]!r}")
    config = LaunchConfig(
        job=args.job,
        replica=args.replica,
        node=args.node,
        nproc_per_node=args.nproc_per_node,
        command=command,
        working_dir=args.working_dir,
        env=dict(item.split("=", 1) for item in args.env),
        fork_server=not args.no_fork_server,
        preload=tuple(m.strip() for m in args.preload.split(",") if m.strip()),
        stop_grace_seconds=args.stop_grace_seconds,
        incarnation=args.incarnation,
    )

    async def setup(ctx: ServiceContext) -> None:
        await LaunchAgent(ctx, config).start()

    return run_service("node-agent", Settings(), setup)


def _monitor(args: argparse.Namespace) -> int:
    if args.gpus < 0:
        _parser().error("--gpus must be >= 0")
    config = MonitorConfig(
        node=args.node, slots=args.gpus, address=args.address, log_dir=args.log_dir
    )

    async def setup(ctx: ServiceContext) -> None:
        await NodeMonitor(ctx, config).start()

    return run_service("node-monitor", Settings(), setup)


if __name__ == "__main__":
    sys.exit(main())
