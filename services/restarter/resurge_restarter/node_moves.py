"""Moving a job off a node at its next checkpoint: for a quarantine, a drain, a warning.

:meth:`NodeMover.move_off` asks the job for a checkpoint and waits (at most the job's
``elastic.checkpointTimeoutSeconds``) until every rank saved one newer than it had. The
request asks the workers to hold after saving (``hold_seconds``: that bound plus
:data:`HOLD_MARGIN_SECONDS`, for the move's stop to reach them), so the job resumes at
the step after its checkpoint and trains none twice, from the disk as from memory; a job
whose workers do not run ``resurge.worker`` (they report no progress: nothing to ask a
checkpoint of) is moved at once. Then the move is decided
and carried out as any recovery is: a ``node``-scoped fault of the given reason goes to
the restarter's fault path (``move``), which moves the job's replicas on the node to
other nodes (or, where none fits, back to Pending) and has the job avoid the node. The
fault carries no generation: a restart meanwhile must not make the move look stale.
It answers what it did, in words, for the record and the operator.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from resurge.control.effects.checkpoint_first import checkpoint_first
from resurge.control.state.records import JobRecord, JobStore
from resurge.events import FaultDetected, FaultScope, RecoveryLevel, Severity
from resurge.runtime.service import ServiceContext

__all__ = ["HOLD_MARGIN_SECONDS", "MoveOff", "NodeMover", "runs_on"]

_ATTEMPTS = 3  # a fault's own restart may win the record meanwhile: ask again
# How long held workers wait past the checkpoint bound for the move's stop: the
# restarter's decision and the agents' stop, on a loaded control plane.
HOLD_MARGIN_SECONDS = 15.0


@dataclass(frozen=True)
class MoveOff:
    """Why jobs leave ``node``: the fault ``reason`` their move records, in ``words``;
    ``occasion`` makes each occasion's fault ids its own (a quarantine's start, a drain's
    request)."""

    node: str
    reason: str
    words: str
    occasion: str
    evidence: dict[str, str | int | float | bool | None] = field(default_factory=dict)


def runs_on(record: JobRecord, node: str) -> bool:
    """Whether ``record``'s job runs (or is recovering) with a replica on ``node``."""
    return not record.phase.finished and any(p.node == node for p in record.placements)


class NodeMover:
    """Moves jobs off nodes through the restarter's fault path (``move``)."""

    def __init__(
        self, ctx: ServiceContext, jobs: JobStore, move: Callable[[FaultDetected], Awaitable[None]]
    ) -> None:
        self.ctx = ctx
        self.jobs = jobs
        self.move = move

    async def move_off(self, record: JobRecord, off: MoveOff) -> str:
        """Move ``record``'s job off ``off.node`` at its next checkpoint; what it did."""
        said = "moved at once: its workers do not run resurge.worker (no checkpoint to ask for)"
        for _ in range(_ATTEMPTS):
            if record.reports_progress:  # it runs resurge.worker: it can checkpoint on request
                had = -1 if record.latest_checkpoint is None else record.latest_checkpoint.step
                bound = record.spec.spec.elastic.checkpoint_timeout_seconds
                if not await checkpoint_first(
                    self.ctx.bus,
                    self.jobs,
                    record,
                    off.words,
                    bound,
                    self.ctx.log,
                    hold_seconds=bound + HOLD_MARGIN_SECONDS,
                ):
                    found = await self.jobs.get(record.name)
                    if found is None or not runs_on(found[0], off.node):
                        return "a fault's restart took it off the node meanwhile"
                    record = found[0]
                    continue  # a fault started another generation on the node: again
                found = await self.jobs.get(record.name)
                newest = None if found is None else found[0].latest_checkpoint
                said = (
                    f"checkpointed step {newest.step}, then moved"
                    if newest is not None and newest.step > had
                    else f"no new checkpoint within {bound:g} s: moved from step {max(had, 0)}"
                )
            found = await self.jobs.get(record.name)
            if found is None or not runs_on(found[0], off.node):
                return "already off the node"
            await self.move(self._fault(found[0], off))
            return said
        return "restarted by faults on the node meanwhile; not moved"

    def _fault(self, record: JobRecord, off: MoveOff) -> FaultDetected:
        replica = next(p.replica for p in record.placements if p.node == off.node)
        return FaultDetected(
            source=self.ctx.bus.source,
            fault_id=f"{off.reason}:{off.node}:{off.occasion}:{record.uid}",
            scope=FaultScope.NODE,
            reason=off.reason,
            severity=Severity.ERROR,
            message=off.words,
            evidence={"node": off.node, **off.evidence},
            suggested_level=RecoveryLevel.NODE,
            job=record.name,
            generation=None,
            node=off.node,
            replica=replica,
        )
