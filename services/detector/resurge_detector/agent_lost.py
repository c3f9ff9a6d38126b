"""Agent-lost detector: pure logic, no I/O.

A node's monitor publishes ``agent_state`` with state ``lost`` when a replica's agent
(``resurge-node-agent launch``) dies without being told to: SIGKILL, OOM, a crash.
Its workers died with it (parent-death signal) and nobody is left to report their
exits, so the peers would wait in their collectives until a timeout. This is a
process-scope fault about the replica: reason ``agent_lost``, suggested level ``pod``
(the replica's agent is recreated), in the job's current generation.

Ids derive from the input event's id, so a redelivered input is de-duplicated.
"""

from __future__ import annotations

from resurge.detection import DetectorContext
from resurge.events import (
    AgentState,
    AgentStateChanged,
    Envelope,
    FaultScope,
    RecoveryLevel,
    Severity,
)

__all__ = ["AgentLostDetector"]


class AgentLostDetector:
    """A replica's agent reported lost: a fault asking for a new agent (pod level)."""

    name = "agent_lost"
    kinds = frozenset({"agent_state"})

    def observe(self, event: AgentStateChanged, ctx: DetectorContext) -> list[Envelope]:
        """A fault for a lost agent of a running job's replica; none otherwise."""
        if not isinstance(event, AgentStateChanged) or event.state is not AgentState.LOST:
            return []
        record = ctx.job(event.job) if event.job is not None else None
        if record is None or record.phase.finished or event.replica is None:
            return []
        return [
            ctx.fault(
                fault_id=f"agent_lost:{event.job}:g{record.generation}:p{event.replica}",
                reason="agent_lost",
                scope=FaultScope.PROCESS,
                severity=Severity.ERROR,
                message=f"replica {event.replica}'s agent on {event.node} died: {event.detail}",
                evidence={"detail": event.detail, "lost_at": event.time.isoformat()},
                suggested_level=RecoveryLevel.POD,
                job=event.job,
                generation=record.generation,
                replica=event.replica,
                node=event.node,
                id=f"fault-{event.id}",
            )
        ]

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        """Nothing to judge over time."""
        return []
