"""The control-plane chaos bench's worker: no torch, it counts steps and reports them.

``--job NAME`` is only there to be read back from ``/proc/PID/cmdline`` (the bench finds
every worker of a job that way); ``--steps N --step-seconds S`` is how long a generation
trains. Each generation starts again from the step of its resume point (none: 0), so a
restarted job still ends.
"""

from __future__ import annotations

import argparse
import sys
import time

from resurge import worker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--job", required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    args = parser.parse_args()
    run = worker.connect()
    for step in range((run.resume_step or 0) + 1, args.steps + 1):
        time.sleep(args.step_seconds)
        run.progress(step, step_seconds=args.step_seconds)
        if run.checkpoint_due(step):
            run.checkpoint_saved(step, f"{args.job}-{step}")
    run.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
