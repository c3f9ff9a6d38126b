"""``resurge``: the user's command line (DESIGN section 7).

The parser is built from :mod:`resurge.cli.commands`, one module per command, each
registering its parser and the function that runs it. How a command finds its cluster
(``RESURGE_NATS_URL`` or the local cluster in the state folder, and as which NATS user)
is :mod:`resurge.cli.connect`'s. ``--state-dir`` goes before or after any subcommand
(:func:`~resurge.cli.arguments.state_dir_everywhere` gives it to every subparser).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from resurge.cli.arguments import STATE_DIR_HELP, describe_subcommands, state_dir_everywhere
from resurge.cli.commands import COMMANDS, WITHOUT_STATE

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
    parser.add_argument("--state-dir", type=Path, default=None, help=STATE_DIR_HELP)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    state_dir_everywhere(parser)
    for command in WITHOUT_STATE:  # after: these need no state folder
        command.add_parser(commands)
    describe_subcommands(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``resurge`` command from ``argv`` (default ``sys.argv[1:]``); its exit status.

    Output piped into a reader that stops early (``| head``) ends the command quietly."""
    try:
        args = _parser().parse_args(argv)
        status: int = args.run(args)
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's own flush cannot fail
        return 0


if __name__ == "__main__":
    sys.exit(main())
