"""A plain PyTorch Lightning DDP script: it never imports resurge and reports no progress.

``Trainer(strategy="ddp", accelerator="cpu")`` with torchrun's environment (Lightning
reads it as a TorchElastic cluster and calls ``init_process_group`` through ``env://``),
a linear model on random data, ``--steps N`` steps of ``--step-seconds S`` each, then it
exits 0. Its only sign of life resurge can have is its rendezvous.
"""

import argparse
import os
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Linear(L.LightningModule):
    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.step_seconds = step_seconds

    def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
        time.sleep(self.step_seconds)
        (x,) = batch
        loss: torch.Tensor = self.layer(x).pow(2).mean()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    data = DataLoader(TensorDataset(torch.randn(16 * args.steps, 8)), batch_size=16)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy="ddp",
        max_steps=args.steps,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(Linear(args.step_seconds), data)
    print(f"rank {trainer.global_rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
