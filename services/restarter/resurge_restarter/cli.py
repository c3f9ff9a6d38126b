"""``resurge-restarter``: command line of the restarter service."""

from __future__ import annotations

import argparse
import sys

from resurge.runtime.service import run_service
from resurge.runtime.settings import Settings
from resurge_restarter.service import setup

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the restarter until SIGTERM or SIGINT; the exit status."""
    argparse.ArgumentParser(
        prog="resurge-restarter",
        description=(
            "The resurge restarter service: on each fault it starts a new generation of "
            "the job (Stop to every replica, then Assign), up to the job's restart limit "
            "(recovery.jobMaxRetryCount), then marks the job Failed. Settings come from "
            "RESURGE_* environment variables (RESURGE_NATS_URL, RESURGE_NAMESPACE, ...)."
        ),
    ).parse_args(argv)
    return run_service("restarter", Settings(), setup)


if __name__ == "__main__":
    sys.exit(main())
