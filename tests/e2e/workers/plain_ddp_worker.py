"""A plain torch.distributed script (gloo) as torchrun runs one: it never imports resurge.

It joins the process group from the environment (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``), then all-reduces a tensor every ``--step-seconds`` and
prints ``step N world W`` every ``--print-every`` steps, until ``--steps`` (0: until
stopped).
"""

import argparse
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--print-every", type=int, default=10)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    world = dist.get_world_size()
    step = 0
    while args.steps == 0 or step < args.steps:
        step += 1
        value = torch.ones(1)
        dist.all_reduce(value)
        if step % args.print_every == 0:
            print(f"step {step} world {world}", flush=True)
        time.sleep(args.step_seconds)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
