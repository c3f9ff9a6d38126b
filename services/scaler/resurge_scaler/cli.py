"""``resurge-scaler``: command line of the scaler service."""

from __future__ import annotations

import argparse
import sys

from resurge.runtime.service import run_service
from resurge.runtime.settings import Settings
from resurge_scaler.service import setup

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the scaler service until SIGTERM."""
    argparse.ArgumentParser(
        prog="resurge-scaler",
        description=(
            "The resurge scaler service: admits submitted jobs in priority order when "
            "their minimum size fits on the cluster's nodes, creates their worker groups "
            "through the cluster backend, starts generation 0, marks a job Succeeded when "
            "every replica finished, and frees its nodes. Settings come from RESURGE_* "
            "environment variables (RESURGE_NATS_URL, RESURGE_NAMESPACE, ...)."
        ),
    ).parse_args(argv)
    return run_service("scaler", Settings(), setup)


if __name__ == "__main__":
    sys.exit(main())
