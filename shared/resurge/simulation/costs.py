"""One cost model for every policy: a restart's seconds as a sum of named parts.

A restart at a rung costs, from the decision to training again, the parts on its
critical path (:func:`breakdown`), for a job of ``ranks`` ranks:

- ``stop``: the old generation stopped (``stop_seconds``; in-process:
  ``in_process_stop_seconds``, the ranks leave their training function and tear their
  process group down);
- ``worker_group``: a worker group (pod) created on a node, in place (``pod``; every
  group at ``job``) or on a spare that takes over a lost node (``node``, and ``job`` for
  a node's fault): the same ``worker_group_seconds`` whoever asks;
- ``process_start``: the new generation's processes: forked from the pre-warmed fork
  server (``fork_start_seconds``) or a cold interpreter importing torch
  (``cold_start_seconds``); a new worker group has no fork server yet, so it starts cold,
  and the others, which start in parallel, are off the critical path;
- ``group``: the process group formed over every rank, ``group_base_seconds +
  group_seconds_per_rank * ranks``: every rung starts a new generation on every rank;
- ``state``: the training state read back: from the disk checkpoint
  (``state_gb_per_gpu`` at ``storage_gbps_per_gpu``, every GPU reading its share at
  once), from a peer's memory over the network (``network_gbps_per_gpu``), or from the
  rank's own memory (not modelled: 0);
- ``warmup``: the first step's extra time in new processes (``warmup_seconds``); an
  in-process restart keeps its processes and pays none.

Detection is not a restart part: it is each failure kind's detector setting
(``failures.<kind>.detection_seconds``), charged before the decision.

Policies differ only in which parts their rungs include: a rung's row in the ladder
(:mod:`resurge.control.decisions.ladder`: in-process, what it recreates, whether it leaves
the node) and whether the policy's workers come from a fork server (``fork_server``).
The same event costs the same parts under every policy. :class:`CostParts` holds the
parts (a config's ``costs`` block); docs/simulation.md says where each default comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from resurge.contract.vocabulary import RecoveryLevel
from resurge.control.decisions.ladder import rung

__all__ = ["PARTS", "CostParts", "Pricing", "Resume", "breakdown", "price"]

Resume = Literal["disk", "peer", "memory"]
"""Where a restart reads the training state from: the disk checkpoint, a peer's memory
over the network, or the rank's own node's memory."""

PARTS = ("stop", "worker_group", "process_start", "group", "state", "warmup")
"""The parts of a restart, in the order they happen."""


class CostParts(BaseModel):
    """The parts a restart is made of (the module); every field in seconds unless its
    name says otherwise."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stop_seconds: float = Field(ge=0, description="The old generation's processes stopped.")
    in_process_stop_seconds: float = Field(
        ge=0, description="In-process: every rank leaves its training function."
    )
    fork_start_seconds: float = Field(ge=0, description="Workers forked from a fork server.")
    cold_start_seconds: float = Field(
        ge=0, description="Workers as new interpreters importing torch."
    )
    worker_group_seconds: float = Field(
        ge=0, description="A worker group (pod) created on a node, in place or on a spare."
    )
    group_base_seconds: float = Field(ge=0, description="Process-group formation, fixed part.")
    group_seconds_per_rank: float = Field(
        ge=0, description="Process-group formation, per rank of the job."
    )
    state_gb_per_gpu: float = Field(ge=0, description="Training state each GPU reads back (GB).")
    storage_gbps_per_gpu: float = Field(
        gt=0, description="Checkpoint storage read bandwidth per GPU, all reading (GB/s)."
    )
    network_gbps_per_gpu: float = Field(
        gt=0, description="Network bandwidth per GPU for a peer's copy (Gb/s)."
    )
    warmup_seconds: float = Field(ge=0, description="A new process's first step, extra.")

    def scaled(self, factors: dict[str, float]) -> CostParts:
        """These parts with the named fields multiplied by their factors."""
        return self.model_copy(
            update={name: getattr(self, name) * factor for name, factor in factors.items()}
        )


def breakdown(
    parts: CostParts,
    level: RecoveryLevel,
    ranks: int,
    *,
    fork_server: bool = True,
    resume: Resume = "disk",
) -> dict[str, float]:
    """Seconds of each part of a restart at ``level`` of a job of ``ranks`` ranks whose
    state comes from ``resume`` (the module); parts the rung does not include are 0."""
    row = rung(level)
    out = dict.fromkeys(PARTS, 0.0)
    if row.in_process:
        out["stop"] = parts.in_process_stop_seconds
    else:
        out["stop"] = parts.stop_seconds
        forked = parts.fork_start_seconds if fork_server else parts.cold_start_seconds
        if row.recreates != "none" or row.leaves_node == "always":
            # a new worker group on the critical path; the rest start in parallel
            out["worker_group"] = parts.worker_group_seconds
            out["process_start"] = max(parts.cold_start_seconds, forked - out["worker_group"])
        else:
            out["process_start"] = forked
        out["warmup"] = parts.warmup_seconds
    out["group"] = parts.group_base_seconds + parts.group_seconds_per_rank * ranks
    if resume == "disk":
        out["state"] = parts.state_gb_per_gpu / parts.storage_gbps_per_gpu
    elif resume == "peer":
        out["state"] = parts.state_gb_per_gpu * 8.0 / parts.network_gbps_per_gpu
    return out


def price(
    parts: CostParts,
    level: RecoveryLevel,
    ranks: int,
    *,
    fork_server: bool = True,
    resume: Resume = "disk",
) -> float:
    """Seconds of a restart at ``level``: the sum of its :func:`breakdown`."""
    return sum(breakdown(parts, level, ranks, fork_server=fork_server, resume=resume).values())


@dataclass(frozen=True)
class Pricing:
    """One policy's restart prices for a job of ``ranks`` ranks: the cost model over
    ``parts``, except the rungs ``fixed`` gives whole seconds (a user's measured figure),
    to which only a peer's transfer is added when a restart resumes from a peer. That
    transfer is ``peer_seconds`` where the policy's peer recovery sets its own, else the
    cost model's ``state`` part."""

    parts: CostParts
    ranks: int
    fork_server: bool = True
    fixed: Mapping[RecoveryLevel, float] = field(default_factory=dict)
    peer_seconds: float | None = None

    def seconds(self, level: RecoveryLevel, resume: Resume = "disk") -> float:
        """Decision to training again at ``level``, the state read from ``resume``."""
        if level in self.fixed:
            if resume != "peer":
                return self.fixed[level]
            return self.fixed[level] + self._peer()
        if resume == "peer" and self.peer_seconds is not None:
            memory = price(self.parts, level, self.ranks, fork_server=self.fork_server,
                           resume="memory")  # fmt: skip
            return memory + self.peer_seconds
        return price(self.parts, level, self.ranks, fork_server=self.fork_server, resume=resume)

    def _peer(self) -> float:
        if self.peer_seconds is not None:
            return self.peer_seconds
        return breakdown(self.parts, RecoveryLevel.PROCESS, 0, resume="peer")["state"]
