"""Reports from workers that use ``resurge.worker``, relayed by their agent on
``raw.<job>.<kind>.<node>``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt

from resurge.events.envelope import Envelope

__all__ = [
    "RESTORE_SOURCES",
    "CheckpointSaved",
    "Progress",
    "RestoreSource",
    "StateRestored",
    "WorkerFault",
]


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


RestoreSource = Literal["memory", "peer", "disk", "start"]
RESTORE_SOURCES: tuple[RestoreSource, ...] = ("memory", "peer", "disk", "start")
"""Where a generation's protected state came from, best first (the worker wire's
``restored`` sources): its own node's live snapshot, another rank's over the process
group, the disk checkpoint (no complete live copy), nothing (a fresh start)."""


class StateRestored(Envelope):
    """A worker that registered its state (``resurge.worker``'s ``protect``) restored it
    as its generation began: from where, at which step, and why, in words.

    Each worker says it once per generation; ``generation`` is the one it restored for."""

    kind: Literal["restored"] = "restored"
    local_rank: int = Field(ge=0, description="Rank of the worker within its replica.")
    step: NonNegativeInt | None = Field(
        description="The step whose state it resumed from; None when it started fresh "
        "(`origin` `start`).",
        examples=[119],
    )
    origin: RestoreSource = Field(
        description="Where the state came from (the worker's `source`; the envelope's "
        "`source` is the agent that published it): `memory` (its own node's live snapshot), "
        "`peer` (another rank's, over the process group), `disk` (no complete live copy: "
        "the disk checkpoint of `step`), `start` (nothing to resume from).",
        examples=["peer"],
    )
    detail: str = Field(
        default="",
        max_length=2048,
        description="Why, in words (at most 2 KiB).",
        examples=["step 119 from rank 0's memory"],
    )
    sharded: bool = Field(
        default=False,
        description="Whether the state is cut in shards, one per rank: a live copy then "
        "serves only a generation of the same world size (a resize needs a disk checkpoint), "
        "unless `reshardable`.",
    )
    reshardable: bool = Field(
        default=False,
        description="Whether those shards can be cut again for another world size (DTensors "
        "cut on their first dimension, as FSDP2 cuts them): a resize then re-cuts them from "
        "the ranks' memory, with no disk checkpoint first.",
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
