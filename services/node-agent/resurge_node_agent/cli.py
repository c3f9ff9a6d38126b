"""``resurge-node-agent``: command line of the node agent.

``launch`` takes its replica's worker group as one JSON document (see
:mod:`resurge_node_agent.launch.group_spec`); a missing or invalid one exits with status 2 and
a message naming the field. ``monitor`` takes the node's own flags; a ``--label`` that is
not ``key=value`` with a Kubernetes-style key and value exits with status 2 naming it.
Connection settings come from ``RESURGE_*`` variables for both.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from resurge.control.effects.nodes import parse_label
from resurge.runtime.service import ServiceContext, run_service
from resurge.runtime.settings import Settings
from resurge_node_agent.launch.agent import LaunchAgent
from resurge_node_agent.launch.group_spec import WORKER_GROUP_ENV, SpecError, read_spec
from resurge_node_agent.monitor.node_monitor import MonitorConfig, NodeMonitor
from resurge_node_agent.private import make_undumpable

__all__ = ["main"]

# Kubernetes passes the node name through the downward API under this name.
NODE_NAME = "NODE_NAME"

_SPEC_EXAMPLE = (
    '{"job": "J", "replica": 0, "node": "N", "nproc": 2, "command": ["python", "train.py"]}'
)


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
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Run one replica's workers, as its worker group says. The worker group is one "
            f"JSON document, read from ${WORKER_GROUP_ENV} or from the file given by "
            "--spec:\n\n"
            f"  {WORKER_GROUP_ENV}='{_SPEC_EXAMPLE}' resurge-node-agent launch\n\n"
            "Fields: job, replica, node, nproc (worker processes), command (worker argv), "
            "env (extra worker environment), working_dir, stop_grace_seconds (SIGTERM to "
            "SIGKILL), fork_server (fork workers from a pre-warmed server), preload "
            "(modules the fork server imports), incarnation. An invalid document exits "
            "with status 2 and names the field."
        ),
    )
    launch.add_argument(
        "--spec",
        metavar="PATH",
        default=None,
        help=f"read the worker group from this JSON file ('-': standard input) instead of "
        f"${WORKER_GROUP_ENV}",
    )
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
        "--gpus",
        type=int,
        default=None,
        help="slots the node offers, as GPUs simulated where NVML finds none (a local "
        "virtual node; kind). Default: the GPUs NVML finds, none simulated. On Kubernetes "
        "a node's allocatable accelerator (RESURGE_KUBE_ACCELERATOR) decides its slots "
        "wherever a device plugin advertises it",
    )
    monitor.add_argument(
        "--address", default="127.0.0.1", help="address other nodes reach this one at"
    )
    monitor.add_argument(
        "--log-dir", type=Path, default=None, help="write each launch agent's output here"
    )
    monitor.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a node label, e.g. topology.kubernetes.io/zone=a (repeatable; Kubernetes "
        "label rules for the key and value)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the agent in the mode ``argv`` names; its exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.mode == "monitor":
        return _monitor(parser, args)
    try:
        spec = read_spec(args.spec, os.environ, sys.stdin)
    except SpecError as error:
        parser.exit(2, f"resurge-node-agent launch: error: {error}\n")
    # Workers inherit the agent's environment; the document is the agent's, not theirs.
    os.environ.pop(WORKER_GROUP_ENV, None)

    async def setup(ctx: ServiceContext) -> None:
        make_undumpable()  # before any worker: none may read its environment or memory
        await LaunchAgent(ctx, spec).start()

    return run_service("node-agent", Settings(), setup, manage_streams=False)


def _monitor(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.gpus is not None and args.gpus < 0:
        parser.error("--gpus must be >= 0")
    labels: dict[str, str] = {}
    for text in args.label:
        try:
            key, value = parse_label(text)
        except ValueError as error:
            parser.error(f"--label: {error}")
        labels[key] = value
    config = MonitorConfig(
        node=args.node,
        slots=args.gpus,
        address=args.address,
        log_dir=args.log_dir,
        labels=labels,
    )

    async def setup(ctx: ServiceContext) -> None:
        make_undumpable()  # its launch agents' workers may not read its NATS user either
        await NodeMonitor(ctx, config).start()

    return run_service("node-monitor", Settings(), setup, manage_streams=False)


if __name__ == "__main__":
    sys.exit(main())
