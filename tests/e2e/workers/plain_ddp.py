"""A plain torchrun-style DDP script: it never imports resurge and reports no progress.

``init_process_group("gloo")`` from torchrun's environment, a DDP-wrapped linear model,
``--steps N`` optimizer steps of ``--step-seconds S`` each, then it exits 0. The only
sign of life resurge can have from it is its rendezvous.
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_seconds)
    print(f"rank {dist.get_rank()} done", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
