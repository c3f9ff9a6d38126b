"""``resurge convert FILE``: a HyperPod HyperPodPyTorchJob manifest as a TrainingJob.

Needs no cluster. Writes the TrainingJob YAML to stdout (or ``--out``), and one warning
line on stderr per manifest field that has no TrainingJob field of its own, naming it by
its path and saying where it went or why it was dropped. Exit status 0, warnings or not;
2, naming the problem, for a file that cannot be read, is not YAML, is not a
HyperPodPyTorchJob, or converts into a job that does not validate.
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
        "Prints the job on stdout (or writes --out) and, on stderr, a warning per manifest "
        "field with no TrainingJob field of its own, naming it by its path and saying where "
        "it went (pod settings stay in spec.template, used on Kubernetes only) or why it was "
        "dropped. A hyperpodrun or torchrun launcher is taken off the command. Needs no "
        "cluster. Exit status 0, with warnings or without; 2 for a file that is not YAML, "
        "not a HyperPodPyTorchJob, or that converts into a job that does not validate. "
        "docs/coming-from-hyperpod.md has the field mapping.",
    )
    convert.add_argument("file", type=Path, help="the HyperPodPyTorchJob YAML manifest")
    convert.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the TrainingJob YAML to FILE instead of stdout",
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
    text = conversion.to_yaml(source=args.file.name)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0
