"""A small FSDP2 training script whose sharded state survives a lost node without the disk.

Each rank holds a shard of one model (``torch.distributed.fsdp.fully_shard``, gloo on CPU
or NCCL on GPUs) and of its Adam state. Under resurge the script registers both with
``run.protect(..., sharded=True)``: every step each rank snapshots its shard to its
node's memory and to its buddy's, a rank on the next node, so a restart (a killed rank,
a node lost) goes on from the step it was at, each shard taken from its own node or its
buddy; after a resize each rank cuts its part again from the old shards, gathered from
memory. Only where no complete live copy is left (a node and its buddy lost together)
does it resume from the disk checkpoint, which it writes every ``--checkpoint-every``
steps with ``torch.distributed.checkpoint``::

    torchrun --nproc-per-node 2 examples/fsdp/train_fsdp.py --steps 40 --checkpoint-every 10

Sample ``i`` of step ``s`` depends only on ``(seed, s, i)``: a resumed run at the same
world size computes what an uninterrupted one does. Rank 0 prints ``params-sha256`` of
the gathered parameters at the end. Without resurge installed it trains and checkpoints
all the same.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

CHECKPOINT_NAME = re.compile(r"^step-(\d{8})$")
FEATURES, HIDDEN, BATCH = 16, 64, 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=40, help="total training steps")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=int(os.environ.get("RESURGE_CHECKPOINT_INTERVAL_STEPS") or 10),
        help="save to disk every K steps (0: never; default: $RESURGE_CHECKPOINT_INTERVAL_STEPS, "
        "else 10)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=Path(os.environ.get("RESURGE_CHECKPOINT_DIR") or "checkpoints"),
        help="where step-<8 digits> checkpoints go (default: $RESURGE_CHECKPOINT_DIR, else "
        "./checkpoints)",
    )
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (demos)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def batch(seed: int, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s share of step ``step``'s global batch of ``BATCH`` samples."""
    share = BATCH // world
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    targets = torch.tanh(inputs.sum(dim=1, keepdim=True))
    return inputs[rank * share : (rank + 1) * share], targets[rank * share : (rank + 1) * share]


def newest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """The highest-step ``step-NNNNNNNN`` folder DCP finished (it has ``.metadata``)."""
    found = [
        (int(match.group(1)), child)
        for child in (directory.iterdir() if directory.is_dir() else [])
        if (match := CHECKPOINT_NAME.match(child.name)) and (child / ".metadata").is_file()
    ]
    return max(found) if found else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if BATCH % world:
        sys.exit(f"{Path(sys.argv[0]).name}: error: WORLD_SIZE={world} does not divide {BATCH}")
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
    if use_cuda:
        model = model.cuda()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    try:
        from resurge import worker

        run: Any = worker.connect()
    except ImportError:
        run = None
    protected = run.protect(model=model, optimizer=optimizer, sharded=True) if run else None
    live = protected.restore() if protected is not None else None
    start = 1
    if protected is not None and live is not None:
        start = live + 1
        print(f"rank {rank}/{world}: resuming at step {start}, {protected.restored.detail}")
    else:
        assigned = run.resume_checkpoint if run is not None else None
        newest = newest_checkpoint(args.checkpoint_dir)
        path = Path(assigned) if assigned else (newest[1] if newest else None)
        if path is not None:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            state: dict[str, Any] = {
                "model": model_state,
                "optim": optimizer_state,
                "step": torch.tensor(0),
            }
            dcp.load(state, checkpoint_id=path)
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
            start = int(state["step"]) + 1
            print(f"rank {rank}/{world}: resuming from {path} at step {start}")
        else:
            print(f"rank {rank}/{world}: starting fresh at step 1")
    sys.stdout.flush()

    for step in range(start, args.steps + 1):
        inputs, targets = batch(args.seed, step, rank, world)
        device = "cuda" if use_cuda else "cpu"
        loss = nn.functional.mse_loss(model(inputs.to(device)), targets.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if protected is not None:
            protected.snapshot(step)
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        if run is not None:
            run.progress(step, loss=float(reduced) / world, total_steps=args.steps)
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {float(reduced) / world:.6f}", flush=True)
        if args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
            path = args.checkpoint_dir / f"step-{step:08d}"
            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save(
                {"model": model_state, "optim": optimizer_state, "step": torch.tensor(step)},
                checkpoint_id=path,
            )
            if run is not None:
                run.checkpoint_saved(step, str(path))
        if args.step_seconds > 0:
            import time

            time.sleep(args.step_seconds)

    if protected is not None:
        protected.close()
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.full_tensor().detach().cpu().numpy().tobytes())
    if rank == 0:
        print(f"final step {args.steps}", flush=True)
        print(f"params-sha256 {digest.hexdigest()}", flush=True)
    if run is not None:
        run.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
