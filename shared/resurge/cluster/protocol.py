"""The cluster-backend protocol (DESIGN section 6) and the records it trades in.

Restarter and scaler call a backend to list nodes, create or delete the worker group
of (job, replica) on a node, and cordon nodes. ``local`` keeps both as JetStream KV
records that each virtual node's monitor agent reconciles, the way a kubelet
reconciles pods; the Kubernetes backend will map them to pods and node objects.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ClusterBackend", "NodeInfo", "WorkerGroupSpec"]


class NodeInfo(BaseModel):
    """A node as its monitor agent reports it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Node name.")
    slots: int = Field(ge=0, description="GPUs (or simulated GPUs) a worker group can use.")
    healthy: bool = Field(default=True, description="False when the node should get no work.")
    cordoned: bool = Field(default=False, description="True when no new work may be placed.")
    cordon_reason: str = Field(default="", description="Why it was cordoned, in words.")
    address: str = Field(default="127.0.0.1", description="Address workers on it are reached at.")
    labels: dict[str, str] = Field(default_factory=dict, description="Node labels.")
    heartbeat: datetime = Field(
        default_factory=lambda: datetime.now(UTC), description="When its monitor last wrote."
    )

    def alive(self, now: datetime, timeout_seconds: float) -> bool:
        return (now - self.heartbeat).total_seconds() <= timeout_seconds

    @property
    def schedulable(self) -> bool:
        return self.healthy and not self.cordoned


class WorkerGroupSpec(BaseModel):
    """What a node runs for one replica of one job: a ``resurge-node-agent launch``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str = Field(description="Job name.")
    replica: int = Field(ge=0, description="Replica index.")
    node: str = Field(description="Node that runs it.")
    nproc: int = Field(ge=1, description="Worker processes (slots it takes).")
    command: list[str] = Field(min_length=1, description="Worker argv.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra worker environment.")
    working_dir: str | None = Field(default=None, description="Folder the workers start in.")
    stop_grace_seconds: float = Field(default=10.0, gt=0, description="SIGTERM to SIGKILL.")
    fork_server: bool = Field(default=True, description="Fork workers from a pre-warmed server.")
    preload: list[str] = Field(
        default_factory=lambda: ["torch"], description="Modules the fork server imports."
    )  # the scaler copies spec.preloadModules here
    incarnation: int = Field(
        default=0, ge=0, description="Bumped to recreate the group (a pod-level restart)."
    )


class ClusterBackend(Protocol):
    async def list_nodes(self) -> list[NodeInfo]: ...

    async def list_worker_groups(self) -> list[WorkerGroupSpec]: ...

    async def create_worker_group(self, spec: WorkerGroupSpec) -> None: ...

    async def delete_worker_group(self, job: str, replica: int, node: str) -> None: ...

    async def cordon(self, node: str, cordoned: bool = True, reason: str = "") -> None:
        """Mark ``node`` unschedulable (and unhealthy, with ``reason``), or undo that."""
        ...
