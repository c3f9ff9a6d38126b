"""A stand-in training worker with no torch: counts steps, crashes once on purpose.

Reads torchrun's ``RANK`` and resurge's ``RESURGE_GENERATION``. In generation 0 the
rank named by ``--crash-rank`` exits 1 at step ``--crash-step``; every other run counts
to ``--steps`` and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from resurge.worker.environment import GENERATION


def main(argv: list[str] | None = None) -> int:
    """Count the steps, crashing where asked; returns the worker's exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument("--crash-step", type=int, default=5)
    args = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    generation = int(os.environ.get(GENERATION, "0"))
    world = os.environ["WORLD_SIZE"]
    print(f"rank {rank}/{world} generation {generation} starting", flush=True)
    for step in range(1, args.steps + 1):
        time.sleep(args.step_seconds)
        if generation == 0 and rank == args.crash_rank and step == args.crash_step:
            print(f"rank {rank} crashing at step {step} on purpose", file=sys.stderr, flush=True)
            return 1
    print(f"rank {rank} finished {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
