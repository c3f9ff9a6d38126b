"""``resurge report JOB``: a job's timeline as JOB.png and JOB.html
(:mod:`resurge.cli.report` writes them)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resurge.cli.connect import on_bus

if TYPE_CHECKING:
    from resurge.runtime.bus import Bus

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``report``."""
    report = commands.add_parser(
        "report",
        help="write a job's timeline as JOB.png and a self-contained JOB.html",
        description="Write a job's timeline, read back from the durable streams (so it "
        "works after the job ended): steps and world size over time, faults and "
        "recoveries with their level and duration, resizes, and a summary of goodput and "
        "time lost by cause. Needs matplotlib (pip install 'resurge[report]').",
    )
    report.add_argument("job", help="the job's name")
    report.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder for JOB.png and JOB.html (default: reports/JOB/ in the state folder, "
        "for example .resurge/reports/JOB/)",
    )
    report.add_argument(
        "--uid",
        metavar="UID",
        help="report this run of JOB (a job deleted and submitted again under its name is "
        "a new run; `resurge status JOB --json` shows its uid); default: the current run, "
        "or the newest one stored",
    )
    report.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the report; the exit status."""

    async def write(bus: Bus, _local: bool) -> int:
        from resurge.cli.report import write_report

        return await write_report(bus, args)

    return on_bus(args, write)
