"""A small DistributedDataParallel training script that runs under torchrun and under resurge.

It reads torchrun's environment, trains a 2-layer MLP on synthetic data, checkpoints with
``torch.distributed.checkpoint`` (DCP) every ``--checkpoint-every`` steps and resumes
where it left off. The batch of step ``s`` on rank ``r`` depends only on
``(seed, s, r)``, so a resumed run computes exactly what an uninterrupted one does::

    torchrun --nproc-per-node 2 examples/ddp/train.py --steps 60 --checkpoint-every 10

Where it resumes from, first match wins:

1. ``RESURGE_RESUME_CHECKPOINT`` (``run.resume_checkpoint``): the latest checkpoint every
   rank completed, as resurge assigns it to a new generation;
2. not under resurge: the newest complete checkpoint in ``--checkpoint-dir`` (complete:
   DCP wrote its ``.metadata`` file, which happens last, after every rank's data);
3. otherwise step 1.

``resurge`` is optional: without it the script uses a local no-op stand-in. With it,
each generation runs under ``resurge.worker.restartable``: an in-process restart tears
down the process group and calls ``run_generation`` again in the same process, with the
new generation's ranks, port and checkpoint; without an agent it runs once.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT_NAME = re.compile(r"^step-(\d{8})$")
IN_FEATURES, HIDDEN, OUT_FEATURES, BATCH = 16, 32, 4, 32


class _NoOpRun:
    """Stands in for ``resurge.worker.WorkerRun`` when resurge is not installed."""

    connected = False
    stop_pending = False

    def __init__(self) -> None:
        self.resume_checkpoint: str | None = os.environ.get("RESURGE_RESUME_CHECKPOINT") or None
        step = os.environ.get("RESURGE_RESUME_STEP")
        self.resume_step: int | None = int(step) if step else None

    def progress(self, step: int, **metrics: float) -> None:
        return None

    def checkpoint_saved(self, step: int, path: str) -> None:
        return None

    def close(self) -> None:
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=60, help="total training steps")
    parser.add_argument(
        "--checkpoint-every", type=int, default=10, help="save every K steps (0: never)"
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=Path(os.environ.get("RESURGE_CHECKPOINT_DIR") or "checkpoints"),
        help="where step-<8 digits> checkpoints go (default: $RESURGE_CHECKPOINT_DIR or "
        "./checkpoints)",
    )
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="sleep this long every step (demos)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    parser.add_argument("--log-every", type=int, default=5, help="rank 0 prints every N steps")
    return parser.parse_args(argv)


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}"


def newest_complete_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """The highest-step ``step-NNNNNNNN`` folder that has DCP's ``.metadata`` file."""
    if not directory.is_dir():
        return None
    found = []
    for child in directory.iterdir():
        match = CHECKPOINT_NAME.match(child.name)
        if match and (child / ".metadata").is_file():
            found.append((int(match.group(1)), child))
    return max(found) if found else None


def batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs and targets of ``step`` on ``rank``: a function of (seed, step, rank) only."""
    generator = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 10_007 + rank) % 2**63)
    teacher = torch.Generator().manual_seed(seed)  # the function every batch samples
    weight = torch.randn(IN_FEATURES, OUT_FEATURES, generator=teacher)
    inputs = torch.randn(BATCH, IN_FEATURES, generator=generator)
    noise = 0.01 * torch.randn(BATCH, OUT_FEATURES, generator=generator)
    return inputs, torch.tanh(inputs @ weight) + noise


def state_for(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optimizer_state, "step": torch.tensor(step)}


def params_digest(model: nn.Module) -> tuple[float, str]:
    """Sum of every parameter (float64) and a SHA-256 of their bytes (bitwise identity)."""
    total = 0.0
    digest = hashlib.sha256()
    for parameter in model.parameters():
        data = parameter.detach().cpu().contiguous()
        total += float(data.double().sum())
        digest.update(data.numpy().tobytes())
    return total, digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # plain `python train.py`: 1 process
    os.environ.setdefault("MASTER_PORT", "29500")
    try:
        from resurge import worker
    except ImportError:
        return run_generation(_NoOpRun(), args, "not installed")
    agent = os.environ.get("RESURGE_AGENT_SOCKET")
    # Under a resurge agent, every in-process restart calls run_generation again here.
    return worker.restartable(run_generation)(args, f"agent at {agent}" if agent else "no agent")


def run_generation(run: Any, args: argparse.Namespace, link: str) -> int:
    """One generation: join the process group its environment names, train, leave."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    # A bounded timeout: when a peer dies or hangs, the others fail their next collective
    # instead of waiting forever, and resurge (or torchrun) restarts the group.
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        timeout=timedelta(seconds=60),
    )
    train(args, run, link, torch.device("cuda", local_rank) if use_cuda else torch.device("cpu"))
    # Only now, with the DDP wrapper gone: its C++ reducer holds the process group, and if
    # the reducer drops the last reference, gloo's destructor joins its worker threads
    # while holding the GIL, which one of them may need (an exit hang seen with torch
    # 2.13). Dropped from Python instead, the process group is destroyed without the GIL.
    gc.collect()
    dist.destroy_process_group()
    return 0


def train(args: argparse.Namespace, run: Any, link: str, device: torch.device) -> None:
    """Train from wherever there is to resume from to ``args.steps``; rank 0 prints the result."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT_FEATURES)
    ).to(device)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    loss_fn = nn.MSELoss()

    # Where to resume from. Under resurge the agent names the checkpoint (or none: start
    # fresh); otherwise rank 0 looks in the checkpoint folder and tells the others.
    resume: str | None = run.resume_checkpoint
    if resume is None and "RESURGE_GENERATION" not in os.environ:
        choice: list[Any] = [None]
        if rank == 0:
            newest = newest_complete_checkpoint(args.checkpoint_dir)
            choice = [str(newest[1]) if newest else None]
        dist.broadcast_object_list(choice, src=0)
        resume = choice[0]

    start = 1
    if resume is not None:
        state = state_for(ddp, optimizer, 0)
        dcp.load(state, checkpoint_id=resume)
        set_state_dict(
            ddp, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        saved_step = int(state["step"])
        if run.resume_step is not None and run.resume_step != saved_step:
            print(
                f"rank {rank}: warning: RESURGE_RESUME_STEP={run.resume_step} but {resume} "
                f"holds step {saved_step}; continuing after step {saved_step}",
                file=sys.stderr,
                flush=True,
            )
        start = saved_step + 1
        print(
            f"rank {rank}/{world_size}: resuming from {resume} at step {start} (resurge: {link})",
            flush=True,
        )
    else:
        print(f"rank {rank}/{world_size}: starting fresh at step 1 (resurge: {link})", flush=True)

    last = start - 1
    for step in range(start, args.steps + 1):
        inputs, targets = batch(args.seed, step, rank)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        last = step
        value = float(loss.detach())
        run.progress(step, loss=value)
        if rank == 0 and (step % args.log_every == 0 or step == start):
            print(f"step {step} loss {value:.6f}", flush=True)
        if args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
            path = checkpoint_path(args.checkpoint_dir, step)
            # Collective: every rank calls it; it returns after rank 0 wrote .metadata.
            dcp.save(state_for(ddp, optimizer, step), checkpoint_id=path)
            run.checkpoint_saved(step, str(path))
        if args.step_seconds > 0:
            time.sleep(args.step_seconds)

    if rank == 0:
        total, digest = params_digest(model)
        print(f"final step {last}", flush=True)
        print(f"params-sum {total:.6f}", flush=True)
        print(f"params-sha256 {digest}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
