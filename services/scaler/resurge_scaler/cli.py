"""``resurge-scaler``: command line of the scaler service."""

from __future__ import annotations

import argparse
import sys

from resurge.service import run_service
from resurge_scaler.service import ScalerSettings, make_setup

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="resurge-scaler",
        description=(
            "The resurge scaler service: admits submitted jobs at their minimum size, "
            "places replicas on the nodes in RESURGE_NODES (comma-separated), starts "
            "generation 0, and marks a job Succeeded when every replica finished. "
            "Settings come from RESURGE_* environment variables."
        ),
    ).parse_args(argv)
    settings = ScalerSettings()
    return run_service("scaler", settings, make_setup(settings))


if __name__ == "__main__":
    sys.exit(main())
