"""PyTorch Lightning: checkpointless recovery with one callback.

``ResurgeCheckpointless`` protects a Lightning run's state with resurge's worker library
(:mod:`resurge.worker.protect`)::

    from resurge.integrations.lightning import ResurgeCheckpointless

    trainer = L.Trainer(strategy="ddp", callbacks=[ResurgeCheckpointless()], ...)
    trainer.fit(model, data)   # a restart goes on from the newest step live in memory

The contract:

- At ``on_fit_start`` it registers the LightningModule (``model``), each optimizer
  (``optimizer``, ``optimizer_1``...), each lr scheduler (``lr_scheduler``...), the fit
  loop (``fit_loop``: the global step, the epoch and batch progress, and the position
  of stateful dataloaders), the precision plugin (``precision``: AMP's grad scaler) and
  the other callbacks' states (``callbacks``) with ``run.protect``, and calls
  ``restore()``. That hook is the first one after the strategy set up the process
  group, wrapped the model and created the optimizers and schedulers, and before the
  fit loop reads its progress (``trainer.fit`` calls ``setup`` before the optimizers
  exist, ``on_train_start`` after the fit loop reset itself).
- If a live step came back, the trainer is where that step left it: its state is what
  Lightning saves in a checkpoint at ``on_train_batch_end``, so Lightning's own restart
  logic carries it on (global step, epoch, batch within the epoch, schedulers). A
  ``ckpt_path`` given to ``fit`` is then not restored (when the job's disk checkpoint,
  ``run.resume_checkpoint``, is newer than every live step, ``restore()`` returns None
  and Lightning restores ``ckpt_path`` as usual).
- Mid-epoch: Lightning starts a plain dataloader's epoch over on a resume and counts
  its batches from where the epoch stopped, so it would train the epoch's first batches
  again and never see its last ones. The callback draws and drops the batches the epoch
  already trained before the first new one (their loading costs time, not their
  training), unless every train dataloader is stateful (``state_dict`` and
  ``load_state_dict``, e.g. torchdata's ``StatefulDataLoader``): Lightning puts those
  back itself, from the fit loop's state. Right before that first new batch it sets
  the random number generators (torch, Python, numpy) back to the snapshot's, as the
  uninterrupted run had them there (after a snapshot that ended an epoch, it sets them
  back and then makes the next epoch's iterator again, as that run did). The same
  batches come back, and a resume at an unchanged world size continues bit for bit,
  when the epoch's order and batches are fixed by the epoch: a ``DistributedSampler``
  (Lightning's default under DDP) or a sequential sampler, and no random transforms in
  dataloader worker processes (a shuffling sampler without its own seeded generator
  draws a new order, and workers their seeds, when the iterator is created, which a
  resume does again).
- After each optimizer step (``on_train_batch_end`` once ``trainer.global_step``
  moved: not while gradients accumulate) it calls ``snapshot(trainer.global_step)``;
  at the end of ``fit``, or on an exception, ``close()``.
- It needs the ``lightning`` package, 2.5 or newer (:class:`RuntimeError` otherwise): an
  older fit loop trains again the batch of a state saved at ``on_train_batch_end``.
- Replicated state only (DDP and single-device strategies; ``sharded=False``): FSDP's
  and DeepSpeed's optimizer states go through their strategy, which this callback does
  not call. A script without the callback runs as before; without a resurge agent
  (no ``RESURGE_SNAPSHOT_DIR``) the callback snapshots nothing and restores nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import lightning
import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from resurge import worker
from resurge.worker.protect import rng_state, set_rng_state

if TYPE_CHECKING:
    from resurge.worker import WorkerRun
    from resurge.worker.protect import ProtectedState, Restored, Stateful

__all__ = ["ResurgeCheckpointless"]

OLDEST = (2, 5)  # the first fit loop that resumes a state of on_train_batch_end exactly


class ResurgeCheckpointless(pl.Callback):
    """Snapshots the run's state to the node's memory after every optimizer step and
    resumes a restarted ``fit`` from the newest step live among the ranks.

    ``run``: this worker's :class:`resurge.worker.WorkerRun` if the script already
    connected (default: :func:`resurge.worker.connect` at the first ``fit``).
    ``every``: snapshot every this many optimizer steps (default: the job's
    ``spec.checkpoint.memoryIntervalSteps``, else 1). After a ``fit`` started,
    ``restored`` says where this rank's state came from (``memory``, ``peer``, ``disk``
    or ``start``) and ``restored_step`` is the live step it went on from (None: none).
    """

    def __init__(self, run: WorkerRun | None = None, *, every: int | None = None) -> None:
        _check_version(lightning.__version__)
        self.run = run
        self.every = every
        self.state: ProtectedState | None = None
        self.restored: Restored | None = None
        self.restored_step: int | None = None
        self._last_step = 0
        self._resume: _Resume | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Register the fit's state and restore the newest live step, if any."""
        if self.run is None:
            self.run = worker.connect()
        objects: dict[str, Any] = _objects(trainer, pl_module, self)
        self.state = self.run.protect(every=self.every, **objects)
        self.restored_step = self.state.restore()
        self.restored = self.state.restored
        self._last_step = trainer.global_step
        if self.restored_step is None:
            return
        connector = trainer._checkpoint_connector
        if connector._loaded_checkpoint:  # the disk checkpoint of fit(ckpt_path=...)
            rank_zero_info(
                f"resurge: resuming from step {self.restored_step}, live in memory, not "
                f"from the checkpoint at {connector._ckpt_path}"
            )
            connector._loaded_checkpoint = {}
            connector._ckpt_path = None
        self._resume = _Resume(trainer, rng_state())

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After a restore: catch the first draw from the epoch's data iterator (the fit
        loop made it and has not drawn from it yet)."""
        if self._resume is not None:
            self._resume.install()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Warn if the fit loop made a new data iterator before its first draw after
        the restore."""
        resume, self._resume = self._resume, None
        if resume is not None and resume.bypassed():
            rank_zero_warn(
                "resurge: the fit loop replaced its data iterator before the first batch "
                "after the restore: the epoch's batches start over (Lightning's own "
                "behaviour), the random generators were not set back"
            )

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Snapshot the state once an optimizer step moved the global step."""
        step = trainer.global_step
        if self.state is None or step == self._last_step:
            return
        self._last_step = step
        self.state.snapshot(step)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Wait for the snapshot in flight and unhook the optimizers."""
        self._close()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """As :meth:`on_fit_end`."""
        self._close()

    def _close(self) -> None:
        state, self.state = self.state, None
        self._resume = None
        if state is not None:
            state.close()


def _check_version(version: str) -> None:
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) < OLDEST:
        raise RuntimeError(
            f"resurge's Lightning callback needs lightning {OLDEST[0]}.{OLDEST[1]} or newer, "
            f"not {version}: an older fit loop trains a snapshot's last batch again"
        )


def _objects(
    trainer: pl.Trainer, pl_module: pl.LightningModule, me: pl.Callback
) -> dict[str, Stateful]:
    """What a Lightning checkpoint holds of a fit in progress, by fixed names."""
    objects: dict[str, Stateful] = {
        "model": pl_module,
        "fit_loop": trainer.fit_loop,
        "precision": trainer.precision_plugin,
        "callbacks": _Callbacks(trainer, me),
    }
    for index, optimizer in enumerate(trainer.optimizers):
        objects[_numbered("optimizer", index)] = optimizer
    for index, config in enumerate(trainer.lr_scheduler_configs):
        objects[_numbered("lr_scheduler", index)] = config.scheduler
    return objects


def _numbered(name: str, index: int) -> str:
    return name if index == 0 else f"{name}_{index}"


class _Callbacks:
    """The trainer's other callbacks' states, by ``state_key``, as a checkpoint has them."""

    def __init__(self, trainer: pl.Trainer, me: pl.Callback) -> None:
        self.trainer = trainer
        self.me = me

    def _others(self) -> list[pl.Callback]:
        return [callback for callback in self.trainer.callbacks if callback is not self.me]  # type: ignore[attr-defined]

    def state_dict(self) -> dict[str, Any]:
        states = {callback.state_key: callback.state_dict() for callback in self._others()}
        return {key: state for key, state in states.items() if state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for callback in self._others():
            if callback.state_key in state:
                callback.load_state_dict(state[callback.state_key])


class _Resume:
    """Puts the first epoch after a restore where the snapshot left it: skips the
    batches it trained, then sets the random generators back, at the first draw."""

    def __init__(self, trainer: pl.Trainer, rng: dict[str, Any]) -> None:
        self.trainer = trainer
        self.rng = rng
        self.done = False
        self.installed: _FirstDraw | None = None

    def install(self) -> None:
        fetcher = getattr(self.trainer.fit_loop, "_data_fetcher", None)
        if fetcher is None or getattr(fetcher, "iterator", None) is None:
            return
        self.installed = _FirstDraw(fetcher.iterator, self._before_first_draw)
        fetcher.iterator = self.installed

    def bypassed(self) -> bool:
        """Whether the first batch came, or will come, from another iterator than ours."""
        fetcher = getattr(self.trainer.fit_loop, "_data_fetcher", None)
        iterator = getattr(fetcher, "iterator", None)
        return not self.done and (self.installed is None or iterator is not self.installed)

    def _before_first_draw(self, inner: Iterator[Any]) -> Iterator[Any]:
        loop = self.trainer.fit_loop
        loader = loop._combined_loader
        if loader is not None and all(_stateful(each) for each in loader.flattened):
            # Lightning put their position back from the fit loop's state.
            set_rng_state(self.rng)
        elif trained := int(loop.epoch_loop.batch_progress.current.ready):
            # The batches this epoch trained before the snapshot (Lightning counts them
            # as fetched already): drawn again and dropped.
            for _ in range(trained):
                next(inner)
            set_rng_state(self.rng)
            epoch = self.trainer.current_epoch
            rank_zero_info(f"resurge: skipped the {trained} batches epoch {epoch} trained before")
        else:
            # The snapshot ended an epoch: make the next one's iterator anew, as an
            # uninterrupted run does at its start, with the same random draws.
            set_rng_state(self.rng)
            inner = iter(inner)
        self.done = True
        return inner


class _FirstDraw:
    """``inner``, or what ``before(inner)`` returns, called once before the first draw."""

    def __init__(
        self, inner: Iterator[Any], before: Callable[[Iterator[Any]], Iterator[Any]]
    ) -> None:
        self.inner = inner
        self.before: Callable[[Iterator[Any]], Iterator[Any]] | None = before

    def __iter__(self) -> _FirstDraw:
        return self

    def __next__(self) -> Any:
        before, self.before = self.before, None
        if before is not None:
            self.inner = before(self.inner)
        return next(self.inner)


def _stateful(loader: object) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )
