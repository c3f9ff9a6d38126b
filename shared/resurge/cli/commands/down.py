"""``resurge down``: stop the local cluster in the state folder."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``down``."""
    down = commands.add_parser("down", help="stop the local cluster and everything it runs")
    down.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Stop the cluster; the exit status."""
    from resurge.local.state import resolve_state_dir
    from resurge.local.updown import down

    return down(resolve_state_dir(args.state_dir))
