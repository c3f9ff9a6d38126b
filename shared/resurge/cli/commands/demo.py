"""``resurge demo``: the whole story on a local cluster of its own."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``demo``."""
    demo = commands.add_parser(
        "demo",
        help="the whole story: up, a DDP job, a worker killed and recovered, a summary, down",
        description="The whole story in one command: a local cluster (2 nodes x 2 simulated "
        "GPUs), the DDP example, one worker killed and the job recovered, a summary, then "
        "everything stopped. It runs in a temporary state folder (removed if it passes), "
        "or in --state-dir DIR, which is kept; a folder where a cluster runs is refused.",
    )
    demo.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; the exit status."""
    from resurge.local.demo import run_demo

    return run_demo(args.state_dir)
