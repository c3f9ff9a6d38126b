"""Reports from workers that use ``resurge.worker``, relayed by their agent on
``raw.<job>.<kind>.<node>``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from resurge.events.envelope import Envelope

__all__ = ["CheckpointSaved", "Progress", "WorkerFault"]


class Progress(Envelope):
    """A worker finished a training step (also its heartbeat)."""

    kind: Literal["progress"] = "progress"
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    step: int = Field(ge=0, description="Training step just completed.", examples=[120])
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Numbers the worker reported with the step (loss, ...)."
    )
    in_process: bool = Field(
        default=False,
        description="The worker runs under `resurge.worker.restartable`, so it can be "
        "restarted in-process.",
    )


class CheckpointSaved(Envelope):
    """A worker finished writing its part of a checkpoint."""

    kind: Literal["checkpoint_saved"] = "checkpoint_saved"
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    step: int = Field(ge=0, description="Training step the checkpoint holds.")
    path: str = Field(description="Where the checkpoint is (a folder or URI).")
    world_size: int | None = Field(
        default=None,
        ge=1,
        description="Ranks in the worker's generation (its WORLD_SIZE): the step's checkpoint "
        "is complete once that many ranks of the same generation reported it. None from an "
        "agent of an earlier release (the job record's world size is then assumed, for the "
        "current generation only).",
        examples=[8],
    )


class WorkerFault(Envelope):
    """A worker under ``resurge.worker.restartable`` caught an exception in its training
    function; it stays alive, waiting to be restarted in-process."""

    kind: Literal["worker_fault"] = "worker_fault"
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    exception: str = Field(
        description="The exception's type, qualified.", examples=["builtins.RuntimeError"]
    )
    message: str = Field(default="", description="The exception's message, cut to 2 KiB.")
    traceback: str = Field(default="", description="The end of the traceback, cut to 8 KiB.")
