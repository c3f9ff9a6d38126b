"""``resurge events [FILTER]``: what happened, read back from the durable streams
(:mod:`resurge.cli.events` prints them)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from resurge.cli.arguments import age, positive
from resurge.cli.connect import on_bus

if TYPE_CHECKING:
    from resurge.runtime.bus import Bus

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``events``."""
    events = commands.add_parser(
        "events",
        help="print what happened, read back from the durable streams; --follow goes on",
        description="Print what happened to jobs and nodes, oldest first, one line per "
        "event, read back from the durable streams (raw telemetry is kept an hour, the "
        "rest a day): faults, recoveries, phases, resizes, process exits, checkpoints and "
        "progress every N steps. -v prints every event with all its fields, --json each "
        "event as stored.",
    )
    events.add_argument(
        "filter",
        nargs="?",
        default=None,
        help="only this subject filter under <namespace>.v1, e.g. 'fault.>' (every kind "
        "on it is shown)",
    )
    events.add_argument(
        "--job", help="only this job's events (one with no record and no stored event: exit 1)"
    )
    events.add_argument(
        "--since",
        type=age,
        metavar="AGE",
        help="only events younger than AGE, e.g. 90s, 10m, 1h, 2d (default: all kept)",
    )
    events.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new events (Ctrl-C stops)"
    )
    events.add_argument(
        "-v", "--verbose", action="store_true", help="every event, with all its fields"
    )
    events.add_argument("--json", action="store_true", help="print each event as JSON")
    events.add_argument(
        "--every",
        type=positive,
        default=100,
        metavar="N",
        help="show rank 0's progress every N steps (default 100)",
    )
    events.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the events; the exit status."""

    async def show(bus: Bus, _local: bool) -> int:
        from resurge.cli.events import show_events

        return await show_events(bus, args)

    return on_bus(args, show)
