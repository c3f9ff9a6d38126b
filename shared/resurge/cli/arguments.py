"""What every ``resurge`` subcommand's parser shares: argparse types for numbers, ages
and labels, ``--state-dir`` after any subcommand, and a description for every
subcommand that has only a one-line help."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["age", "count", "describe_subcommands", "label", "positive", "state_dir_everywhere"]

STATE_DIR_HELP = "local cluster folder (default: $RESURGE_STATE_DIR or ./.resurge)"


def count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0")
    return value


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def age(text: str) -> float:
    """An argparse type: an age such as ``90s``, ``10m``, ``1h`` or ``2d``, in seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = text[:-1], text[-1:]
    if unit not in units:
        number, unit = text, "s"
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age such as 90s, 10m, 1h or 2d"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0")
    return value


def label(text: str) -> tuple[str, str]:
    """An argparse type: a ``key=value`` node label."""
    from resurge.control.effects.nodes import parse_label

    try:
        return parse_label(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def describe_subcommands(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description its one-line help as one, so that
    ``resurge CMD --help`` says what CMD does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                if not sub.description and choice.help:
                    sub.description = choice.help[:1].upper() + choice.help[1:] + "."
                describe_subcommands(sub)


def state_dir_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept ``--state-dir`` after any subcommand too (DESIGN section 7); given there, it
    wins over one given before the subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument(
                    "--state-dir", type=Path, default=argparse.SUPPRESS, help=STATE_DIR_HELP
                )
                state_dir_everywhere(sub)
