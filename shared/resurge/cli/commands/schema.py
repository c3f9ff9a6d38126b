"""``resurge schema``: the JSON Schemas of the events, or the TrainingJob CRD."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Register ``schema``."""
    schema = commands.add_parser(
        "schema",
        help="print the JSON Schema of every event kind, or write them, or the TrainingJob CRD",
    )
    schema.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write each schema to DIR/NAME.schema.json instead of printing them all as one "
        "JSON document ({name: schema}) on stdout",
    )
    schema.add_argument(
        "--crd",
        type=Path,
        metavar="FILE",
        help="write the TrainingJob CustomResourceDefinition (YAML) to FILE ('-': stdout)",
    )
    schema.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print or write the schemas; the exit status."""
    from resurge.cli.schemas import run_schema

    return run_schema(args.out, args.crd)
