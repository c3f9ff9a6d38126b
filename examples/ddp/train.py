"""A small DistributedDataParallel training script that runs under torchrun and under resurge.

It reads torchrun's environment, trains a 2-layer MLP on synthetic data, checkpoints with
``torch.distributed.checkpoint`` (DCP) every ``--checkpoint-every`` steps and resumes
where it left off, at the same world size or another one::

    torchrun --nproc-per-node 2 examples/ddp/train.py --steps 60 --checkpoint-every 10

Every optimizer step sees the same ``--global-batch`` samples whatever the world size
``W``: each rank takes its own contiguous ``global / W`` of them, in ``k`` micro-batches
of at most ``--micro-batch`` samples with gradient accumulation (DDP synchronises only
the last one). A world size that does not split the global batch into whole, equal
micro-batches is rejected at start with an error that names the flags. Sample ``i`` of
step ``s`` depends only on ``(seed, s, i)``, never on the rank, so a resumed run at the
same world size computes exactly what an uninterrupted one does (bitwise identical
parameters), and a run at another world size computes the same thing up to the order of
floating-point sums. The loss printed and reported is the mean over the global batch.

Where it resumes from, first match wins:

0. under resurge (unless ``--no-protect``): the newest step whose model and optimizer
   state is live in the memory of the job's nodes (``run.protect``, snapshotted every
   step; a rank whose node lost it receives it from a peer);
1. ``RESURGE_RESUME_CHECKPOINT`` (``run.resume_checkpoint``): the latest checkpoint every
   rank completed, as resurge assigns it to a new generation;
2. not under resurge: the newest complete checkpoint in ``--checkpoint-dir`` (complete:
   DCP wrote its ``.metadata`` file, which happens last, after every rank's data);
3. otherwise step 1.

Besides every ``--checkpoint-every`` steps, it saves when resurge asks for a checkpoint
now (before a resize): every rank polls ``run.checkpoint_requested()`` each step, and the
flag travels in the step's loss all-reduce, so that all ranks save at the same step
(``dcp.save`` is collective) as soon as any rank was asked.

``--data-workers N`` loads each step's samples through a ``torch.utils.data.DataLoader``
with N worker processes, as most training scripts do (the same samples in the same
order); the workers are children of the rank's process.

A checkpoint holds the replicated model, the optimizer state by parameter name and the
step, and nothing per rank (the data needs no RNG state), so DCP loads one written at
any world size.

``resurge`` is optional: without it the script uses a local no-op stand-in. With it,
each generation runs under ``resurge.worker.restartable``: an in-process restart tears
down the process group and calls ``run_generation`` again in the same process, which
reads the new generation's ``RANK``, ``WORLD_SIZE``, port and checkpoint afresh and
rebuilds the process group, the batch split and the DDP wrapper from them; without an
agent it runs once.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass
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
IN_FEATURES, HIDDEN, OUT_FEATURES = 16, 32, 4
# Samples drawn from one generator: block b of step s is seeded with (seed, s, b).
BLOCK = 32
# 2 ranks x 32 samples: what a step of the example's 2-rank runs took before it kept the
# global batch constant, so those runs compute exactly what they did.
GLOBAL_BATCH, MICRO_BATCH = 64, 32


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

    def checkpoint_requested(self) -> bool:
        return False

    def close(self) -> None:
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=60, help="total training steps")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=int(os.environ.get("RESURGE_CHECKPOINT_INTERVAL_STEPS") or 10),
        help="save every K steps (0: never; default: the job's spec.checkpoint.intervalSteps "
        "from $RESURGE_CHECKPOINT_INTERVAL_STEPS, else 10)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=Path(os.environ.get("RESURGE_CHECKPOINT_DIR") or "checkpoints"),
        help="where step-<8 digits> checkpoints go (default: $RESURGE_CHECKPOINT_DIR, which "
        "resurge sets to the job's spec.checkpoint.dir or a folder of the job's own; else "
        "./checkpoints)",
    )
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="sleep this long every step (demos)"
    )
    parser.add_argument(
        "--global-batch",
        type=int,
        default=GLOBAL_BATCH,
        help="samples per optimizer step, at any world size",
    )
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=MICRO_BATCH,
        help="most samples in one forward and backward; a rank accumulates the rest",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    parser.add_argument(
        "--data-workers",
        type=int,
        default=0,
        help="load samples through a DataLoader with N worker processes (0: in the rank)",
    )
    parser.add_argument("--log-every", type=int, default=5, help="rank 0 prints every N steps")
    parser.add_argument(
        "--no-in-process",
        action="store_true",
        help="link to the agent without resurge.worker.restartable: every restart and "
        "resize then starts new processes (for comparisons)",
    )
    parser.add_argument(
        "--no-protect",
        action="store_true",
        help="do not snapshot the state to memory: every restart resumes from the disk "
        "checkpoint (for comparisons)",
    )
    args = parser.parse_args(argv)
    for flag, value in (("--global-batch", args.global_batch), ("--micro-batch", args.micro_batch)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, not {value}")
    if args.data_workers < 0:
        parser.error(f"--data-workers must be 0 or more, not {args.data_workers}")
    return args


@dataclass(frozen=True)
class BatchPlan:
    """How one step's global batch is split: ``world_size`` ranks x ``accumulation``
    micro-batches of ``micro_batch`` samples each."""

    global_batch: int
    world_size: int
    micro_batch: int
    accumulation: int

    @classmethod
    def split(cls, global_batch: int, micro_batch: int, world_size: int) -> BatchPlan:
        """Each rank's share in whole micro-batches of at most ``micro_batch`` samples, or
        ValueError naming the flags when the world size does not allow it."""
        share, rest = divmod(global_batch, world_size)
        if share == 0 or rest:
            raise ValueError(
                f"--global-batch {global_batch} does not split evenly over WORLD_SIZE="
                f"{world_size} ranks: use a global batch that is a multiple of every world "
                "size the job may run at"
            )
        micro = min(micro_batch, share)
        if share % micro:
            raise ValueError(
                f"--global-batch {global_batch} gives each of WORLD_SIZE={world_size} ranks "
                f"{share} samples, not a whole number of --micro-batch {micro_batch} "
                f"micro-batches: use a --micro-batch that divides {share}"
            )
        return cls(global_batch, world_size, micro, share // micro)

    def micro_batches(self, rank: int) -> list[tuple[int, int]]:
        """``[start, stop)`` in the global batch of each micro-batch of ``rank``, in order."""
        first = rank * self.micro_batch * self.accumulation
        return [
            (first + i * self.micro_batch, first + (i + 1) * self.micro_batch)
            for i in range(self.accumulation)
        ]

    def __str__(self) -> str:
        ranks = "rank" if self.world_size == 1 else "ranks"
        micro = "micro-batch" if self.accumulation == 1 else "micro-batches"
        return (
            f"{self.global_batch} = {self.world_size} {ranks} x {self.accumulation} {micro} "
            f"of {self.micro_batch}"
        )


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


def block(seed: int, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``index * BLOCK`` to ``(index + 1) * BLOCK - 1`` of ``step``'s global batch,
    inputs and targets: a function of (seed, step, index) only."""
    generator = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 10_007 + index) % 2**63)
    teacher = torch.Generator().manual_seed(seed)  # the function every batch samples
    weight = torch.randn(IN_FEATURES, OUT_FEATURES, generator=teacher)
    inputs = torch.randn(BLOCK, IN_FEATURES, generator=generator)
    noise = 0.01 * torch.randn(BLOCK, OUT_FEATURES, generator=generator)
    return inputs, torch.tanh(inputs @ weight) + noise


def samples(seed: int, step: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``start`` to ``stop - 1`` of ``step``'s global batch: sample ``i`` depends on
    (seed, step, i) only, the same bytes whichever rank or micro-batch takes it."""
    blocks = [block(seed, step, index) for index in range(start // BLOCK, (stop - 1) // BLOCK + 1)]
    offset = start // BLOCK * BLOCK
    inputs = torch.cat([pair[0] for pair in blocks])[start - offset : stop - offset]
    targets = torch.cat([pair[1] for pair in blocks])[start - offset : stop - offset]
    return inputs, targets


class StepShares(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """One rank's micro-batches of steps ``first`` to ``last``, in the order it trains on
    them (``--data-workers``): item ``k`` is what ``samples`` gives for the k-th one."""

    def __init__(self, seed: int, first: int, last: int, micro_batches: list[tuple[int, int]]):
        self.seed, self.first, self.last, self.micro_batches = seed, first, last, micro_batches

    def __len__(self) -> int:
        return max(0, self.last - self.first + 1) * len(self.micro_batches)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        step, micro = divmod(index, len(self.micro_batches))
        start, stop = self.micro_batches[micro]
        return samples(self.seed, self.first + step, start, stop)


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
    link = f"agent at {agent}" if agent else "no agent"
    if args.no_in_process:
        run = worker.connect()
        try:
            return run_generation(run, args, link)
        finally:
            run.close()
    # Under a resurge agent, every in-process restart calls run_generation again here.
    return worker.restartable(run_generation)(args, link)


def run_generation(run: Any, args: argparse.Namespace, link: str) -> int:
    """One generation: join the process group its environment names, train, leave."""
    # Read afresh on every call: an in-process restart applies the new generation's
    # RANK, WORLD_SIZE and MASTER_PORT to os.environ before calling this again.
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    try:
        plan = BatchPlan.split(args.global_batch, args.micro_batch, world_size)
    except ValueError as error:  # every rank sees it, before any of them joins the group
        sys.exit(f"{Path(sys.argv[0]).name}: error: {error}")
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    # A bounded timeout: when a peer dies or hangs, the others fail their next collective
    # instead of waiting forever, and resurge (or torchrun) restarts the group.
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    train(args, plan, run, link, device)
    # Only now, with the DDP wrapper gone: its C++ reducer holds the process group, and if
    # the reducer drops the last reference, gloo's destructor joins its worker threads
    # while holding the GIL, which one of them may need (an exit hang seen with torch
    # 2.13). Dropped from Python instead, the process group is destroyed without the GIL.
    gc.collect()
    dist.destroy_process_group()
    return 0


def train(
    args: argparse.Namespace, plan: BatchPlan, run: Any, link: str, device: torch.device
) -> None:
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

    # Under resurge the model and the optimizer are snapshotted to the node's memory every
    # step, and a new generation first takes the newest step that is live there or on a
    # peer (collective): a rank killed mid-interval costs the step it was in, not the
    # interval. None: nothing complete is live, the disk checkpoint as before.
    protected = None
    if hasattr(run, "protect") and not args.no_protect:
        protected = run.protect(model=ddp, optimizer=optimizer)
    live = protected.restore() if protected is not None else None

    # Where to resume from. Under resurge the agent names the checkpoint (or none: start
    # fresh); otherwise rank 0 looks in the checkpoint folder and tells the others.
    resume: str | None = run.resume_checkpoint if live is None else None
    if live is None and resume is None and "RESURGE_GENERATION" not in os.environ:
        choice: list[Any] = [None]
        if rank == 0:
            newest = newest_complete_checkpoint(args.checkpoint_dir)
            choice = [str(newest[1]) if newest else None]
        dist.broadcast_object_list(choice, src=0)
        resume = choice[0]

    start = 1
    if live is not None:
        start = live + 1
        assert protected is not None and protected.restored is not None
        print(
            f"rank {rank}/{world_size}: resuming at step {start}, {protected.restored.detail} "
            f"(resurge: {link})",
            flush=True,
        )
    elif resume is not None:
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
    if rank == 0:
        print(f"global-batch {plan}", flush=True)

    last = start - 1
    micro_batches = plan.micro_batches(rank)
    loader = None
    if args.data_workers > 0:
        shares = StepShares(args.seed, start, args.steps, micro_batches)
        loader = iter(
            torch.utils.data.DataLoader(shares, batch_size=None, num_workers=args.data_workers)
        )
    for step in range(start, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        share_loss = torch.zeros((), device=device)  # the mean over this rank's share
        for index, (first, stop) in enumerate(micro_batches):
            if loader is None:
                inputs, targets = samples(args.seed, step, first, stop)
            else:
                inputs, targets = next(loader)
            # Gradients add up locally; DDP averages them over the ranks on the last one.
            last_micro = index == len(micro_batches) - 1
            with contextlib.nullcontext() if last_micro else ddp.no_sync():
                loss = loss_fn(ddp(inputs.to(device)), targets.to(device)) / plan.accumulation
                loss.backward()
            share_loss += loss.detach()
        optimizer.step()
        if protected is not None:
            protected.snapshot(step)  # written while the next step computes
        # One all-reduce: the sum of equal shares' means (W x the global mean), and how
        # many ranks were asked for a checkpoint now.
        asked = share_loss.new_tensor(1.0 if run.checkpoint_requested() else 0.0)
        reduced = torch.stack([share_loss, asked])
        dist.all_reduce(reduced)
        last = step
        value = float(reduced[0]) / world_size
        requested = float(reduced[1]) > 0
        run.progress(step, loss=value, total_steps=args.steps)  # `resurge status` progress bar
        if rank == 0 and (step % args.log_every == 0 or step == start):
            print(f"step {step} loss {value:.6f}", flush=True)
        if requested or (args.checkpoint_every > 0 and step % args.checkpoint_every == 0):
            if requested and rank == 0:
                print(f"checkpoint requested: saving at step {step}", flush=True)
            path = checkpoint_path(args.checkpoint_dir, step)
            # Collective: every rank calls it; it returns after rank 0 wrote .metadata.
            dcp.save(state_for(ddp, optimizer, step), checkpoint_id=path)
            run.checkpoint_saved(step, str(path))
        if args.step_seconds > 0:
            time.sleep(args.step_seconds)

    del loader  # stops its worker processes
    if protected is not None:
        protected.close()
    if rank == 0:
        total, digest = params_digest(model)
        print(f"final step {last}", flush=True)
        print(f"params-sum {total:.6f}", flush=True)
        print(f"params-sha256 {digest}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
