"""Reports from workers that use ``resurge.worker``, relayed by their agent on
``raw.<job>.<kind>.<node>``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from resurge.events.envelope import Envelope

__all__ = ["CheckpointSaved", "Progress"]


class Progress(Envelope):
    """A worker finished a training step (also its heartbeat)."""

    kind: Literal["progress"] = "progress"
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    step: int = Field(ge=0, description="Training step just completed.", examples=[120])
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Numbers the worker reported with the step (loss, ...)."
    )


class CheckpointSaved(Envelope):
    """A worker finished writing its part of a checkpoint."""

    kind: Literal["checkpoint_saved"] = "checkpoint_saved"
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    step: int = Field(ge=0, description="Training step the checkpoint holds.")
    path: str = Field(description="Where the checkpoint is (a folder or URI).")
