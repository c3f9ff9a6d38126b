"""``resurge delete JOB``: delete a job and stop its workers."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from resurge.cli.connect import on_bus

if TYPE_CHECKING:
    from resurge.runtime.bus import Bus

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``delete``."""
    delete = commands.add_parser("delete", help="delete a job and stop its workers")
    delete.add_argument("job")
    delete.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Delete the job; the exit status."""

    async def delete(bus: Bus, local: bool) -> int:
        return await _delete(bus, args, local=local)

    return on_bus(args, delete, role="admin")


async def _delete(bus: Bus, args: argparse.Namespace, *, local: bool) -> int:
    """Delete the job; on a local cluster, also the checkpoints resurge chose a folder for
    (:mod:`resurge.local.checkpoints`)."""
    from resurge.control.effects.client import delete_job
    from resurge.local.checkpoints import forget_checkpoints
    from resurge.local.state import resolve_state_dir

    try:
        record = await delete_job(bus, args.job)
    except LookupError as error:
        print(f"resurge delete: {error.args[0]}", file=sys.stderr)
        return 1
    print(f"trainingjob {args.job} deleted")
    if local:
        done = forget_checkpoints(record, resolve_state_dir(args.state_dir))
        if done:
            print(done)
    return 0
