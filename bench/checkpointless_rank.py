"""One gloo rank of bench/checkpointless.py: DDP over an MLP whose protected state
(parameters and Adam's two moments) is about ``--megabytes`` MB, on CPU.

``overhead``: steady-state step times with ``state.snapshot(step)`` every step and
without, in interleaved blocks of ``--block`` steps (``--rounds`` blocks of each, in the
order ABBA ABBA...), the same model and data; rank 0 prints one ``result`` line of
JSON: every timed step (the first step of each block is not timed: it carries the
switch), the time of ``snapshot()`` itself and of ``optimizer.step()`` (which waits for
the previous snapshot's write), five snapshots written alone (``snapshot`` then
``wait``, no training beside them), and the snapshot file's size.

``train``: trains to ``--steps`` with a disk checkpoint every ``--checkpoint-every``
steps (``torch.distributed.checkpoint``, as examples/ddp/train.py saves), resuming from
the newest complete one in ``--checkpoint-dir``; with ``--protect`` it also snapshots
every step to ``RESURGE_SNAPSHOT_DIR`` and resumes from the live copy first. Every rank
prints ``resumed <step> <source> <monotonic time>`` once, ``step <n> <monotonic time>``
after each step and ``rss <peak bytes>`` at the end. Without ``--protect`` it never
imports resurge (the end line ``imports-resurge`` says so): today's plain script.

Step ``s``'s inputs depend on (``s``, rank) only, so a resumed run sees the same data.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
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

LAYERS = 4
# Parameters + Adam's exp_avg + exp_avg_sq, float32.
BYTES_PER_PARAMETER = 3 * 4


def width_for(megabytes: float) -> int:
    """The width of LAYERS square Linear layers whose protected state is ``megabytes``."""
    return max(8, round(math.sqrt(megabytes * 1e6 / (BYTES_PER_PARAMETER * LAYERS))))


def build(megabytes: float) -> tuple[nn.Module, DistributedDataParallel, torch.optim.Adam]:
    torch.manual_seed(0)
    width = width_for(megabytes)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    return model, ddp, optimizer


def batch(step: int, rank: int, size: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(size, width, generator=generator), torch.randn(
        size, width, generator=generator
    )


def peak_rss() -> int:
    """This process's peak resident set (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def forward_backward(
    ddp: DistributedDataParallel, inputs: torch.Tensor, targets: torch.Tensor
) -> None:
    loss = (ddp(inputs) - targets).pow(2).mean()
    loss.backward()


def overhead(args: argparse.Namespace) -> None:
    from resurge import worker

    rank = dist.get_rank()
    _, ddp, optimizer = build(args.megabytes)
    width = width_for(args.megabytes)
    state = worker.connect().protect(model=ddp, optimizer=optimizer)
    times: dict[str, list[float]] = {"off": [], "on": []}
    snapshot_calls: list[float] = []
    optimizer_steps: dict[str, list[float]] = {"off": [], "on": []}
    order = ["off", "on", "on", "off"]
    step = 0
    for _ in range(args.warmup):
        step += 1
        inputs, targets = batch(step, rank, args.batch, width)
        optimizer.zero_grad(set_to_none=True)
        forward_backward(ddp, inputs, targets)
        optimizer.step()
        state.snapshot(step)
    for block in range(2 * args.rounds):
        kind = order[block % len(order)]
        state.wait()
        dist.barrier()
        for index in range(args.block + 1):
            step += 1
            inputs, targets = batch(step, rank, args.batch, width)
            began = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            forward_backward(ddp, inputs, targets)
            stepping = time.perf_counter()
            optimizer.step()
            stepped = time.perf_counter()
            if kind == "on":
                state.snapshot(step)
            ended = time.perf_counter()
            if index == 0:
                continue  # carries the switch: the write of the block before, or none
            times[kind].append(ended - began)
            optimizer_steps[kind].append(stepped - stepping)
            if kind == "on":
                snapshot_calls.append(ended - stepped)
    # A snapshot written alone, nothing else running in the rank: what a step must
    # overlap to hide it, given a free core.
    alone: list[float] = []
    dist.barrier()
    for _ in range(5):
        step += 1
        began = time.perf_counter()
        state.snapshot(step)
        state.wait()
        alone.append(time.perf_counter() - began)
    state.close()
    assert state.folder is not None
    files = [file for file in state.folder.root.rglob("step-*.snap")]
    if rank == 0:
        result = {
            "width": width,
            "parameters": sum(p.numel() for p in ddp.parameters()),
            "times": times,
            "snapshot_calls": snapshot_calls,
            "alone": alone,
            "optimizer_steps": optimizer_steps,
            "snapshot_bytes": max(file.stat().st_size for file in files),
            "rss": peak_rss(),
        }
        print("result " + json.dumps(result), flush=True)


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}"


def newest_checkpoint(directory: Path) -> Path | None:
    """The highest-step checkpoint with DCP's ``.metadata`` (written last): a complete one."""
    complete = sorted(p for p in directory.glob("step-*") if (p / ".metadata").is_file())
    return complete[-1] if complete else None


def state_for(ddp: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    model_state, optimizer_state = get_state_dict(ddp, optimizer)
    return {"model": model_state, "optim": optimizer_state, "step": torch.tensor(step)}


def resume_from_disk(
    args: argparse.Namespace, ddp: nn.Module, optimizer: torch.optim.Optimizer
) -> int:
    choice: list[Any] = [None]
    if dist.get_rank() == 0:
        newest = newest_checkpoint(args.checkpoint_dir)
        choice = [str(newest) if newest else None]
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return 0
    state = state_for(ddp, optimizer, 0)
    dcp.load(state, checkpoint_id=choice[0])
    set_state_dict(ddp, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"])


def train(args: argparse.Namespace) -> None:
    rank = dist.get_rank()
    _, ddp, optimizer = build(args.megabytes)
    width = width_for(args.megabytes)
    print(f"built {time.monotonic():.6f}", flush=True)
    state = None
    start: int | None = None
    source = "disk"
    if args.protect:
        from resurge import worker

        state = worker.connect().protect(model=ddp, optimizer=optimizer)
        start = state.restore()
        assert state.restored is not None
        source = state.restored.source
    if start is None:
        start = resume_from_disk(args, ddp, optimizer)
        source = "disk" if start else "start"
    print(f"resumed {start} {source} {time.monotonic():.6f}", flush=True)
    for step in range(start + 1, args.steps + 1):
        inputs, targets = batch(step, rank, args.batch, width)
        optimizer.zero_grad(set_to_none=True)
        forward_backward(ddp, inputs, targets)
        optimizer.step()
        if state is not None:
            state.snapshot(step)
        if step % args.checkpoint_every == 0:
            dcp.save(
                state_for(ddp, optimizer, step),
                checkpoint_id=checkpoint_path(args.checkpoint_dir, step),
            )
        print(f"step {step} {time.monotonic():.6f}", flush=True)
    if state is not None:
        state.close()
    print(f"rss {peak_rss()}", flush=True)
    print(f"imports-resurge {'resurge' in sys.modules}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["overhead", "train"])
    parser.add_argument("--megabytes", type=float, required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--checkpoint-dir", type=Path)
    parser.add_argument("--protect", action="store_true")
    args = parser.parse_args()
    imported = time.monotonic()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    print(f"phases {imported:.6f} {time.monotonic():.6f}", flush=True)
    if args.mode == "overhead":
        overhead(args)
    else:
        train(args)
    gc.collect()  # the DDP reducer lets go of the group before the group goes
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
