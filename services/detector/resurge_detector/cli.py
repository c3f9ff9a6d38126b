"""``resurge-detector``: command line of the detector service."""

from __future__ import annotations

import argparse
import sys

from resurge.service import run_service
from resurge.settings import Settings
from resurge_detector.service import setup

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="resurge-detector",
        description=(
            "The resurge detector service: reads node agents' raw events and publishes "
            "faults (a worker that crashed or was killed) and finished replicas. "
            "Settings come from RESURGE_* environment variables (RESURGE_NATS_URL, "
            "RESURGE_NAMESPACE, RESURGE_METRICS_PORT, ...)."
        ),
    ).parse_args(argv)
    return run_service("detector", Settings(), setup)


if __name__ == "__main__":
    sys.exit(main())
