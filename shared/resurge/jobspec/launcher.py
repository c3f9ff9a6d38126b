"""The training script's argv inside a torchrun-style launcher command.

HyperPod jobs start their workers through a launcher: ``hyperpodrun`` (HyperPod's
torchrun), ``torchrun`` or ``python -m torch.distributed.run``. resurge's node agent is
the launcher itself and runs ``spec.command`` once per worker, so ``spec.command`` must be
the script's argv. :func:`split_launcher` finds the launcher, its options and the script;
it parses as torchrun does: options before the script, ``--name=value`` or
``--name value``, and a few options that take no value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = ["LAUNCHERS", "Launched", "split_launcher"]

LAUNCHERS = ("hyperpodrun", "torchrun")
"""Launcher programs recognised by name (argv[0], any folder)."""

_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")

# Options of torchrun (torch.distributed.run's store_true flags) and of hyperpodrun that
# take no value; every other option takes one.
_FLAGS = frozenset(
    {
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--inprocess-restart",
        "--inprocess_restart",
    }
)
_NPROC = ("--nproc-per-node", "--nproc_per_node")


@dataclass(frozen=True)
class Launched:
    """A launcher command taken apart."""

    launcher: str
    """How the launcher was named: ``hyperpodrun``, ``torchrun`` or ``python -m MODULE``."""
    options: tuple[str, ...]
    """The launcher's own options, as written."""
    script: tuple[str, ...]
    """The script's argv as resurge runs it: ``python SCRIPT ARGS...``, ``python -m
    MODULE ARGS...`` (``--module``), or ``PROGRAM ARGS...`` (``--no-python``)."""
    nproc_per_node: str | None
    """The value of ``--nproc-per-node`` where given, as written."""


def _launcher_length(argv: Sequence[str]) -> int:
    """How many leading tokens name a launcher: 1, 3 (``python -m MODULE``) or 0."""
    if not argv:
        return 0
    program = PurePosixPath(argv[0]).name
    if program in LAUNCHERS:
        return 1
    if program.startswith("python") and argv[1:2] == ["-m"] and argv[2:3]:
        return 3 if argv[2] in _LAUNCHER_MODULES else 0
    return 0


def _options(argv: Sequence[str], start: int) -> int:
    """Index of the first token after the launcher options that begin at ``start``."""
    index = start
    while index < len(argv) and argv[index].startswith("-"):
        token = argv[index]
        index += 1
        if "=" not in token and token not in _FLAGS:
            index += 1
    return min(index, len(argv))


def _value(options: Sequence[str], names: Sequence[str]) -> str | None:
    for position, token in enumerate(options):
        name, _, value = token.partition("=")
        if name in names:
            return value if value or "=" in token else next(iter(options[position + 1 :]), None)
    return None


def split_launcher(argv: Sequence[str]) -> Launched | None:
    """``argv`` taken apart if it starts a launcher with a script, else None."""
    start = _launcher_length(argv)
    if not start:
        return None
    end = _options(argv, start)
    options, script = tuple(argv[start:end]), tuple(argv[end:])
    if not script:
        return None
    names = {token.partition("=")[0] for token in options}
    if names & {"--no-python", "--no_python"}:
        prefix: tuple[str, ...] = ()
    elif names & {"-m", "--module"}:
        prefix = ("python", "-m")
    else:
        prefix = ("python",)
    return Launched(
        launcher=" ".join(argv[:start]),
        options=options,
        script=prefix + script,
        nproc_per_node=_value(options, _NPROC),
    )
