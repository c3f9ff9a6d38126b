"""A small real torch.distributed worker (gloo) that reports progress through resurge.worker.

Every step is an all-reduce across the job, so a rank that dies or leaves breaks its
peers' next step, as in real data-parallel training. Options: ``--steps N``,
``--step-seconds S``; ``--crash-rank R --crash-at-step K`` makes rank R exit 1 at step K
in every generation (a rank that crashes every time).
"""

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from resurge import worker


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-at-step", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    run = worker.connect()
    total = torch.zeros(1)
    for step in range(1, args.steps + 1):
        if rank == args.crash_rank and step == args.crash_at_step:
            print(f"rank {rank} crashing at step {step}", flush=True)
            os._exit(1)
        value = torch.ones(1)
        dist.all_reduce(value)
        total += value
        run.progress(step, loss=1.0 / step)
        time.sleep(args.step_seconds)
    print(f"rank {rank} done: {int(total.item())}", flush=True)
    run.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
