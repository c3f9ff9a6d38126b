"""``resurge``: the user's command line (DESIGN section 7).

Commands that talk to a cluster use ``RESURGE_NATS_URL`` and ``RESURGE_NAMESPACE`` when
set, else the local cluster recorded in the state folder by ``resurge up``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from resurge.settings import Settings

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resurge",
        description=(
            "resurge keeps distributed PyTorch jobs alive: it detects faults and restarts "
            "what failed. Commands that talk to a cluster read RESURGE_NATS_URL and "
            "RESURGE_NAMESPACE, or else find the local cluster that `resurge up` started "
            "in the state folder."
        ),
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="local cluster folder (default: $RESURGE_STATE_DIR or ./.resurge)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a local cluster: NATS, the services, N nodes")
    up.add_argument("--nodes", type=int, default=2, help="virtual nodes (default 2)")
    up.add_argument(
        "--gpus-per-node", type=int, default=2, help="simulated GPUs per node (default 2)"
    )
    up.add_argument("--port", type=int, default=0, help="NATS port (default: a free one)")
    up.add_argument(
        "--foreground", action="store_true", help="stay attached; Ctrl-C stops the cluster"
    )
    commands.add_parser("down", help="stop the local cluster and everything it runs")
    submit = commands.add_parser("submit", help="submit a TrainingJob YAML file")
    submit.add_argument("file", type=Path)
    delete = commands.add_parser("delete", help="delete a job and stop its workers")
    delete.add_argument("job")
    status = commands.add_parser("status", help="show one job's status, or every job's")
    status.add_argument("job", nargs="?")
    status.add_argument("--json", action="store_true", help="print JSON")
    events = commands.add_parser("events", help="print events as they happen (Ctrl-C stops)")
    events.add_argument(
        "filter",
        nargs="?",
        default=">",
        help="subject filter under <namespace>.v1, e.g. 'fault.>' (default: all)",
    )
    events.add_argument("--json", action="store_true", help="print each event as JSON")
    inject = commands.add_parser("inject", help="break a worker on purpose")
    inject.add_argument(
        "fault", choices=["crash", "hang", "log"], help="SIGKILL, SIGSTOP, or a fake log line"
    )
    inject.add_argument("--job", required=True, help="job name")
    inject.add_argument("--rank", type=int, required=True, help="global rank of the worker")
    inject.add_argument("--line", default="", help="for 'log': the line the worker 'prints'")
    commands.add_parser(
        "demo",
        help="the whole story: up, a DDP job, a worker killed and recovered, a summary, down",
    )
    schema = commands.add_parser("schema", help="write the JSON Schema of every event kind")
    schema.add_argument(
        "--out",
        type=Path,
        default=Path("docs/schemas"),
        help="folder to write into (default docs/schemas)",
    )
    return parser


def _settings(state_dir: Path | None) -> tuple[Settings, bool]:
    """Settings for the cluster to talk to, and whether it is a local one."""
    from resurge.local.state import ClusterState, resolve_state_dir
    from resurge.settings import Settings

    if "RESURGE_NATS_URL" not in os.environ:
        state = ClusterState.load(resolve_state_dir(state_dir))
        if state is not None:
            return Settings(nats_url=state.nats_url, namespace=state.namespace), True
    return Settings(), False


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("up", "down"):
        from resurge.local.state import resolve_state_dir
        from resurge.local.updown import down, up

        state_dir = resolve_state_dir(args.state_dir)
        if args.command == "down":
            return down(state_dir)
        return up(state_dir, args.nodes, args.gpus_per_node, args.port, args.foreground)
    if args.command == "demo":
        from resurge.demo import run_demo

        return run_demo()
    if args.command == "schema":
        from resurge.schemas import write_schemas

        for path in write_schemas(args.out):
            print(path)
        return 0
    from resurge.commands import run_command

    try:
        settings, local = _settings(args.state_dir)
        return asyncio.run(run_command(args, settings, local=local))
    except ConnectionError as error:
        print(f"resurge {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
