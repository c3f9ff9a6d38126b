"""Records and waiting helpers the contract tests share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from resurge.cluster import ClusterChange, NodeInfo, WorkerGroupSpec

# How long a test waits for one change before it fails.
CHANGE_TIMEOUT_SECONDS = 10.0


def node(name: str, slots: int = 2, age_seconds: float = 0.0, **fields: object) -> NodeInfo:
    """A node record whose heartbeat is ``age_seconds`` old."""
    heartbeat = datetime.now(UTC) - timedelta(seconds=age_seconds)
    return NodeInfo.model_validate({"name": name, "slots": slots, "heartbeat": heartbeat, **fields})


def group(job: str, replica: int, on: str, incarnation: int = 0) -> WorkerGroupSpec:
    """A one-process worker group of (``job``, ``replica``) on node ``on``."""
    return WorkerGroupSpec(
        job=job,
        replica=replica,
        node=on,
        nproc=1,
        command=["python", "-c", "pass"],
        incarnation=incarnation,
    )


async def next_changes(changes: AsyncIterator[ClusterChange], count: int) -> list[ClusterChange]:
    """The next ``count`` changes; fails if one takes longer than the timeout."""
    return [await asyncio.wait_for(anext(changes), CHANGE_TIMEOUT_SECONDS) for _ in range(count)]
