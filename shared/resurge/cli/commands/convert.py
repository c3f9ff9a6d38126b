"""``resurge convert FILE``: a HyperPod HyperPodPyTorchJob manifest as a TrainingJob.

Needs no cluster. Writes the TrainingJob YAML to stdout (or ``--out``), and one warning
line on stderr for each thing the conversion changes, naming the manifest field by its
path and saying what became of it: a field with no TrainingJob field of its own, where it
went or why it was dropped; a launcher taken off the command or a shell script; NNODES
added. Exit status 0, warnings or not; with ``--strict``, 1 and no job written where there
is any warning; 2, naming the problem, for a file that cannot be read, is not YAML, is not
a HyperPodPyTorchJob, starts a launcher in a shell script where it cannot be taken off,
or converts into a job that does not validate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_parser", "run"]


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``convert`` with the ``resurge`` subcommands."""
    convert = commands.add_parser(
        "convert",
        help="turn a SageMaker HyperPod HyperPodPyTorchJob manifest into a TrainingJob",
        description="Turn a SageMaker HyperPod HyperPodPyTorchJob manifest "
        "(sagemaker.amazonaws.com/v1) into a TrainingJob YAML that `resurge submit` takes. "
        "Prints the job on stdout (or writes --out) and, on stderr, a warning for each thing "
        "the conversion changes, naming the manifest field by its path: a field with no "
        "TrainingJob field of its own, where it went (pod settings stay in spec.template, "
        "used on Kubernetes only) or why it was dropped; a hyperpodrun or torchrun launcher "
        "taken off the command or off a shell script; NNODES added, as HyperPod sets it. "
        "$(VAR) references in env, command and args are expanded as Kubernetes does. Needs "
        "no cluster. Exit status 0, with warnings or without; with --strict, exit status 1 "
        "and no job where there is any warning; 2 for a file that is not YAML, not a "
        "HyperPodPyTorchJob, a shell script whose launcher cannot be taken off, or that "
        "converts into a job that does not validate. docs/coming-from-hyperpod.md has the "
        "field mapping.",
    )
    convert.add_argument("file", type=Path, help="the HyperPodPyTorchJob YAML manifest")
    convert.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the TrainingJob YAML to FILE instead of stdout",
    )
    convert.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit status 1, no job written) on any warning: the job is then the "
        "manifest with nothing dropped, moved or changed",
    )
    convert.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Convert ``args.file``; the exit status."""
    from resurge.jobspec import JobSpecError
    from resurge.jobspec.hyperpod import HyperPodError, convert_hyperpod_yaml

    try:
        conversion = convert_hyperpod_yaml(args.file.read_text())
    except OSError as error:
        print(f"resurge convert: {error}", file=sys.stderr)
        return 2
    except HyperPodError as error:
        print(f"resurge convert: {args.file}: {error}", file=sys.stderr)
        return 2
    except JobSpecError as error:
        print(f"resurge convert: {args.file}: converts into an {error}", file=sys.stderr)
        return 2
    for note in conversion.notes:
        print(f"resurge convert: warning: {note}", file=sys.stderr)
    if args.strict and conversion.notes:
        count = len(conversion.notes)
        print(
            f"resurge convert: {args.file}: {count} warning(s) above, and --strict: no job written",
            file=sys.stderr,
        )
        return 1
    text = conversion.to_yaml(source=args.file.name)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0
