"""Node capacity, published by each node's monitor agent on ``capacity.<node>``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from resurge.events.envelope import Envelope

__all__ = ["CapacityChanged"]


class CapacityChanged(Envelope):
    """A node's slots, free slots or health changed."""

    kind: Literal["capacity_changed"] = "capacity_changed"
    slots_total: int = Field(ge=0, description="GPUs (or simulated GPUs) on the node.")
    slots_free: int = Field(ge=0, description="Of those, how many no worker group uses.")
    healthy: bool = Field(description="False when the node should get no work.")
    labels: dict[str, str] = Field(default_factory=dict, description="Node labels.")
