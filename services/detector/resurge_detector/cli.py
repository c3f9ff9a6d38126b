"""``resurge-detector``: command line of the detector service."""

from __future__ import annotations

import argparse
import sys

from resurge.detection import ENTRY_POINT_GROUP, UnknownDetectorError
from resurge.runtime.service import run_service
from resurge_detector.service import make_setup
from resurge_detector.settings import DetectorSettings

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the detector service until SIGTERM; 2 when a detector cannot be loaded."""
    argparse.ArgumentParser(
        prog="resurge-detector",
        description=(
            "The resurge detector service: reads node agents' raw events and runs the "
            f"detector plugins of the entry-point group {ENTRY_POINT_GROUP!r} over them "
            "(crashes, hangs, log rules, GPU health, stragglers, node health, and any "
            "installed plugin), publishing faults, finished replicas and node capacity. "
            "Settings: RESURGE_DETECTORS ('all' or a comma-separated list), "
            "RESURGE_DETECTOR_REPLICAS and RESURGE_DETECTOR_INDEX (several replicas share "
            "the jobs by a hash of the job name), RESURGE_DETECTOR_TICK_SECONDS, and the "
            "common RESURGE_NATS_URL, RESURGE_NAMESPACE, RESURGE_METRICS_PORT."
        ),
    ).parse_args(argv)
    settings = DetectorSettings()
    try:
        setup = make_setup(settings)
    except (UnknownDetectorError, ValueError, TypeError) as error:
        print(f"resurge-detector: {error}", file=sys.stderr)
        return 2
    return run_service("detector", settings, setup)


if __name__ == "__main__":
    sys.exit(main())
