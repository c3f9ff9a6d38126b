"""``resurge status [JOB]``: every job in a table, or one job described
(:mod:`resurge.cli.status` draws them)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from resurge.cli.connect import on_bus

if TYPE_CHECKING:
    from resurge.runtime.bus import Bus

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``status``."""
    status = commands.add_parser(
        "status",
        help="every job in a table (live on a terminal), or one job described",
        description="Without JOB: every job in a table (phase, generation, replicas, step "
        "and pace, restarts, last fault, last recovery, goodput, progress toward the final "
        "step when the job reports one), refreshed every second on a terminal until Ctrl-C "
        "(or until the cluster goes away: it says so and exits 1). "
        "With JOB: the job described (faults in words, recoveries, alerts, checkpoint, why "
        "a Pending job waits).",
    )
    status.add_argument("job", nargs="?", help="describe this job")
    status.add_argument("--json", action="store_true", help="print every field as JSON")
    status.add_argument(
        "--uid",
        metavar="UID",
        help="show this run of JOB (a job deleted and submitted again under its name is a "
        "new run; `--json` shows each run's uid), also one deleted since",
    )
    status.add_argument(
        "--once", action="store_true", help="print the table once, even on a terminal"
    )
    status.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Show the jobs; the exit status."""

    async def show(bus: Bus, _local: bool) -> int:
        from resurge.cli.status import show_status

        return await show_status(bus, args)

    return on_bus(args, show)
