"""A rank of the protected-state test (tests/integration/test_protected_state.py): trains
a small model for ``steps`` steps under resurge.worker's protected state, replicated
(``replicated``: DDP), sharded (``sharded``: each rank its own model; ``fsdp``: FSDP2's
``fully_shard``, each rank a shard of one model), and exits with code 3 right after step
``stop_at`` (0: never), as a rank a fault stops. It prints what it restored, and a digest
of its parameters and optimizer state (FSDP's gathered whole) after its restore
(``resumed``), when it stops (``stopped``) and at the end (``digest``)."""

from __future__ import annotations

import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from resurge import worker


def main() -> None:
    steps, stop_at, layout = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sharded = layout in ("sharded", "fsdp")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank if layout == "sharded" else 0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4))
    trained: nn.Module = model
    if layout == "replicated":
        trained = nn.parallel.DistributedDataParallel(model)
    elif layout == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.Adam(trained.parameters(), lr=1e-2)
    torch.manual_seed(1000 + rank)  # each rank's own random stream from here on
    drawn = 0.0
    state = worker.connect().protect(model=trained, optimizer=optimizer, sharded=sharded)
    start = state.restore()
    print(f"restored {state.restored}", flush=True)
    print(f"resumed {whole_digest(model, optimizer)}", flush=True)
    for step in range((start or 0) + 1, steps + 1):
        inputs = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 10 + rank))
        loss = trained(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        drawn = float(torch.rand(1))  # this rank's stream, which a resume must go on with
        state.snapshot(step)
        dist.all_reduce(loss.detach())  # every step together, as FSDP's collectives keep them
        if step == stop_at:
            state.wait()
            print(f"stopped {whole_digest(model, optimizer)}", flush=True)
            os._exit(3)
    state.close()
    print(f"digest {whole_digest(model, optimizer)}", flush=True)
    print(f"drawn {drawn!r}", flush=True)
    dist.destroy_process_group()
    # Past this point torch 2.13 sometimes aborts in its C++ teardown ("terminate called
    # without an active exception", about 1 exit in 12 of this script, with or without
    # snapshots, and at the commit before them too): the run is over, skip the teardown.
    os._exit(0)


def whole_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """A digest of the model's parameters and buffers and the optimizer's state, each
    tensor whole (collective where they are DTensors)."""
    digest = hashlib.sha256()
    tensors = list(model.state_dict().values())
    for per_parameter in optimizer.state_dict()["state"].values():
        tensors += [per_parameter[key] for key in sorted(per_parameter)]
    for tensor in tensors:
        whole = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        digest.update(whole.detach().numpy().tobytes())
    return digest.hexdigest()


if __name__ == "__main__":
    main()
