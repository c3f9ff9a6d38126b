"""plain_lightning.py with resurge's Lightning callback (resurge.integrations.lightning):
a DDP run whose state lives in its nodes' memory, for tests/e2e/test_lightning_checkpointless.py.

``Trainer(strategy="ddp", accelerator="cpu")`` with torchrun's environment, a small model
with dropout (the random generators matter) trained with Adam and a per-step lr
schedule, on a fixed data set that Lightning's DistributedSampler shuffles anew each
epoch (``--batches-per-epoch`` batches per rank), ``--steps`` optimizer steps.
``--stop-at N`` exits with code 3 right after step N (its snapshot written), as a rank a
fault stops; ``--plain`` leaves the callback out (the script as it was);
``--step-seconds S`` makes each step last S seconds more; ``--save-at N --save-to PATH``
saves a Lightning checkpoint after step N, and ``--ckpt-path PATH`` passes one to
``fit``. Each rank reports each step to
its agent (when it has one) and prints where its state came from (``restored ...``), the
steps it trained (``trained FIRST..LAST``), where it ended (``ended step S epoch E``) and
a digest of its parameters (``digest ...``).
"""

import argparse
import hashlib
import os
import sys
import time
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from resurge import worker
from resurge.integrations.lightning import ResurgeCheckpointless

BATCH = 4


class Model(L.LightningModule):
    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.step_seconds = step_seconds
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
        time.sleep(self.step_seconds)
        x, y = batch
        loss: torch.Tensor = (self.net(x) - y).pow(2).mean()
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Watch(L.Callback):
    """Records and reports the steps trained; exits hard after ``stop_at``, its
    snapshot written."""

    def __init__(
        self,
        run: worker.WorkerRun,
        stop_at: int,
        resurge: ResurgeCheckpointless | None,
        save: tuple[int, str | None],
    ) -> None:
        self.run = run
        self.stop_at = stop_at
        self.save_at, self.save_to = save
        self.resurge = resurge
        self.trained: list[int] = []

    def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
        self.trained.append(trainer.global_step)
        self.run.progress(trainer.global_step)
        if trainer.global_step == self.save_at and self.save_to is not None:
            trainer.save_checkpoint(self.save_to)
        if trainer.global_step == self.stop_at:
            if self.resurge is not None and self.resurge.state is not None:
                self.resurge.state.wait()
            os._exit(3)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batches-per-epoch", type=int, default=6)
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--save-to")
    parser.add_argument("--ckpt-path")
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    world = int(os.environ["WORLD_SIZE"])
    size = BATCH * args.batches_per_epoch * world
    data = torch.Generator().manual_seed(1)
    x = torch.randn(size, 8, generator=data)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(size, 1, generator=data)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    run = worker.connect()
    resurge = None if args.plain else ResurgeCheckpointless(run)
    watch = Watch(run, args.stop_at, resurge, (args.save_at, args.save_to))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=world // int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy="ddp",
        max_steps=args.steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[c for c in (resurge, watch) if c is not None],
    )
    model = Model(args.step_seconds)
    trainer.fit(model, loader, ckpt_path=args.ckpt_path)
    print(f"restored {None if resurge is None else resurge.restored}", flush=True)
    print(f"trained {watch.trained[0]}..{watch.trained[-1]}", flush=True)
    print(f"ended step {trainer.global_step} epoch {trainer.current_epoch}", flush=True)
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().numpy().tobytes())
    print(f"digest {digest.hexdigest()}", flush=True)
    run.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
