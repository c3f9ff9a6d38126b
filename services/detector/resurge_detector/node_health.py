"""Node health detector: nodes appearing, going, turning unhealthy, recovering (pure).

Monitor agents publish a NodeReport on every heartbeat. This detector publishes a
CapacityChanged when a node first reports, when its slots or health change, when it
stops reporting for longer than ``silence_seconds`` (lost: no healthy slots), and when
it comes back. A node that turns unhealthy or is lost is also a node-scoped fault for
every running job with a replica on it, except a node whose unhealthy GPUs all await a
reset (``resettable_gpus``): the GPU errors' own faults decide for those jobs.

A node's silence is judged from its last report, and a restarted detector has seen none:
a node that died just before the restart would never be lost. So at its first tick the
detector also awaits a report from every node that a running job is placed on, from
then: one that sends none within ``silence_seconds`` is lost, and its jobs fault (no
capacity is published for it: its slots were never seen).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from resurge.detection import DetectorContext
from resurge.events import CapacityChanged, Envelope, FaultScope, NodeReport, RecoveryLevel

__all__ = ["NodeHealthDetector"]

SILENCE_SECONDS = 15.0


@dataclass
class _Node:
    seen: datetime
    slots_total: int
    slots_free: int
    healthy: bool
    labels: dict[str, str]
    lost: bool = False
    incident: int = 0
    reported: bool = True  # False: awaited since the detector started, never heard


def _awaiting_reset(report: NodeReport) -> bool:
    """Whether every GPU that made the node unhealthy awaits a reset: the GPU errors'
    own faults decide for each job (a reset and a restart in place, or a move)."""
    return bool(report.unhealthy_gpus) and set(report.unhealthy_gpus) <= set(report.resettable_gpus)


class NodeHealthDetector:
    """Node reports to capacity changes; a node gone unhealthy or silent faults its jobs."""

    name = "node_health"
    kinds = frozenset({"node_report"})

    def __init__(self, silence_seconds: float = SILENCE_SECONDS) -> None:
        self.silence_seconds = silence_seconds
        self._nodes: dict[str, _Node] = {}
        self._started = False  # the first tick armed the placed nodes

    def observe(self, event: NodeReport, ctx: DetectorContext) -> list[Envelope]:
        """A capacity change when the node's report changed; faults when it turned unhealthy."""
        if event.node is None:
            return []
        node = self._nodes.get(event.node)
        if node is not None and not node.reported:  # awaited since the start: heard now
            del self._nodes[event.node]
            node = None
        state = (event.slots_total, event.slots_free, event.healthy)
        if (
            node is not None
            and not node.lost
            and (node.slots_total, node.slots_free, node.healthy) == state
        ):
            node.seen = ctx.now
            return []
        was_healthy = node is not None and node.healthy and not node.lost
        if node is None:
            node = self._nodes[event.node] = _Node(ctx.now, *state, labels=event.labels)
        else:
            node.seen, node.lost = ctx.now, False
            node.slots_total, node.slots_free, node.healthy = state
        out: list[Envelope] = [self._capacity(event.node, node, ctx)]
        if was_healthy and not event.healthy:
            node.incident += 1
            if not _awaiting_reset(event):
                why = f"node {event.node} reports unhealthy GPUs {event.unhealthy_gpus}"
                out += self._faults(event.node, node, ctx, "node_unhealthy", why)
        return out

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        """A node silent for ``silence_seconds`` is lost: no capacity, and its jobs fault."""
        if not self._started:
            self._started = True
            self._await_placed(ctx)
        out: list[Envelope] = []
        for name, node in self._nodes.items():
            silent = (ctx.now - node.seen).total_seconds()
            if node.lost or silent <= self.silence_seconds:
                continue
            node.lost = True
            node.incident += 1
            if node.reported:
                out.append(self._capacity(name, node, ctx))
            why = f"node {name} sent no report for {silent:.1f} s"
            out += self._faults(name, node, ctx, "node_lost", why)
        return out

    def _await_placed(self, ctx: DetectorContext) -> None:
        """Await a report, from now, of every node a running job is placed on."""
        for record in ctx.jobs.values():
            if record.phase.finished:
                continue
            for placement in record.placements:
                if placement.node not in self._nodes:
                    self._nodes[placement.node] = _Node(ctx.now, 0, 0, True, {}, reported=False)

    def _capacity(self, name: str, node: _Node, ctx: DetectorContext) -> CapacityChanged:
        healthy = node.healthy and not node.lost
        return CapacityChanged(
            source=ctx.source,
            node=name,
            slots_total=node.slots_total,
            slots_free=node.slots_free if healthy else 0,
            healthy=healthy,
            labels=node.labels,
        )

    def _faults(
        self, name: str, node: _Node, ctx: DetectorContext, reason: str, message: str
    ) -> list[Envelope]:
        faults: list[Envelope] = []
        for record in ctx.jobs_on(name):
            replicas = [p.replica for p in record.placements if p.node == name]
            faults.append(
                ctx.fault(
                    fault_id=f"{reason}:{name}:{node.incident}:{record.name}:g{record.generation}",
                    reason=reason,
                    scope=FaultScope.NODE,
                    message=message,
                    evidence={"node": name, "replicas": ",".join(map(str, replicas))},
                    suggested_level=RecoveryLevel.NODE,
                    job=record.name,
                    generation=record.generation,
                    node=name,
                    replica=replicas[0] if replicas else None,
                )
            )
        return faults
