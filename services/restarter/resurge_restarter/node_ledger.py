"""The restarter's node ledger: every fault of every job, counted against its node.

Each FaultDetected (alerts too) is looked up in the attribution table
(:mod:`resurge.control.decisions.node_attribution`); one that counts against a node is
added to that node's health record (:mod:`resurge.control.state.node_health`,
compare-and-set; :mod:`resurge.control.decisions.node_score` decides). The instance
whose write quarantined the node carries the quarantine out, unless it is a dry run:

1. the node is cordoned, the reason naming the score and the faults behind it;
2. each running job with a replica on it is moved off at its next checkpoint
   (:mod:`.node_moves`), a ``node`` recovery for a fault of reason ``node_quarantined``
   (the job avoids the node from then on). A fatal fault on the node meanwhile moves
   the job at once, as ever.

A dry run only logs what it would do. A quarantined node is asked for health checks
once no job runs on it, and released when it passes one (:mod:`.node_checks`).

A counted warning sign (reason ``gpu_warning``, :mod:`resurge_detector.gpu_warnings`)
whose sign predicts a failure (``corrected_ecc_rising``, ``retired_pages_growing``,
``xid_precursor``) moves each job on the node off it at its next checkpoint, as a
``node`` recovery for ``node_warning``, when ``RESURGE_NODE_PROACTIVE_MOVES`` is on
(the default) and the same incident did not quarantine the node (which moves them
already): once per node and warning (the fault's GPU, sign and ``since``), however many
jobs' faults report it. The job resumes from the checkpoint it has just taken (a job
under ``resurge.worker``'s checkpointless protection from its peers' memory); a job
that reports no checkpoints is moved at once. The score and the quarantine are metrics, worked
out at scrape time from the records as a watch of the bucket last saw them (an operator's
release included): ``resurge_node_score{node}`` (decayed to the scrape) and
``resurge_node_quarantined{node}`` (1 quarantined, 0.5 a dry run's, 0 not); and
``resurge_node_faults_counted_total{rule}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import ValidationError

from resurge.cluster import ClusterBackend
from resurge.contract.subjects import unescape_token
from resurge.control.decisions.node_attribution import attribute
from resurge.control.decisions.node_score import NodePolicy, apply_incident, current_score
from resurge.control.state.node_health import NodeHealth, NodeHealthStore
from resurge.control.state.records import JobRecord, JobStore
from resurge.events import FaultDetected
from resurge.runtime.service import ServiceContext
from resurge_restarter.node_checks import NodeChecks
from resurge_restarter.node_drains import Drainer
from resurge_restarter.node_moves import MoveOff, NodeMover, runs_on

__all__ = ["QUARANTINE_REASON", "WARNING_REASON", "NodeLedger"]

QUARANTINE_REASON = "node_quarantined"
WARNING_REASON = "node_warning"
_PREDICTIVE_SIGNS = frozenset({"corrected_ecc_rising", "retired_pages_growing", "xid_precursor"})


class NodeLedger:
    """Counts faults against nodes; quarantines those past the threshold.

    ``move`` is how a job's move off a quarantined node is decided and carried out (the
    restarter's fault path, given the fault this makes)."""

    def __init__(
        self,
        ctx: ServiceContext,
        backend: ClusterBackend,
        nodes: NodeHealthStore,
        jobs: JobStore,
        move: Callable[[FaultDetected], Awaitable[None]],
        policy: NodePolicy | None = None,
    ) -> None:
        self.ctx = ctx
        self.backend = backend
        self.nodes = nodes
        self.jobs = jobs
        self.mover = NodeMover(ctx, jobs, move)
        self.drainer = Drainer(ctx, backend, nodes, jobs, self.mover)
        self.policy = policy or NodePolicy.of(ctx.settings)
        self.records: dict[str, NodeHealth] = {}
        self.checks = NodeChecks(ctx, backend, nodes, jobs, self.records, self.policy)
        self.proactive = ctx.settings.node_proactive_moves
        self._warned: set[tuple[str, str]] = set()  # (node, warning) moved for already
        self._metrics(ctx.registry)

    def _metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_NodeCollector(self.records, self.policy))
        self.counted = Counter(
            "resurge_node_faults_counted_total",
            "Faults counted against a node, by the attribution rule that counted them.",
            ["rule"],
            registry=registry,
        )

    async def watch(self) -> None:
        """Keep :attr:`records` as the bucket holds them, and take up the drains asked
        there (:mod:`.node_drains`), in a background task."""
        watcher = await self.nodes.kv.watchall()
        self.ctx.exit_stack.push_async_callback(watcher.stop)

        async def pump() -> None:
            async for entry in watcher:
                if entry is None:
                    continue
                if not entry.value:
                    self.records.pop(unescape_token(entry.key), None)
                    continue
                with contextlib.suppress(ValidationError):  # a newer release's record
                    record = NodeHealth.model_validate_json(entry.value)
                    self.records[record.name] = record
                    self.drainer.seen(record)
                    self.checks.seen(record)

        self.ctx.spawn(pump, name="watch_node_health")

    async def on_fault(self, fault: FaultDetected) -> None:
        """Count ``fault`` against its node if the table says so; quarantine the node
        if this write took it past the threshold."""
        counted = attribute(fault)
        if counted is None:
            return
        now = datetime.now(UTC)
        before, after = await self.nodes.mutate(
            counted.node, lambda r: apply_incident(r, fault, counted, now, self.policy)
        )
        if after is before:
            return
        self.counted.labels(counted.rule).inc()
        self.records[after.name] = after
        if before.quarantine is None and after.quarantine is not None:
            await self.quarantine(after)
        elif fault.reason == "gpu_warning" and after.quarantine is None:
            await self.warned(after, fault)

    async def warned(self, node: NodeHealth, fault: FaultDetected) -> None:
        """Move the jobs off ``node`` for the warning sign ``fault`` reports, if it
        predicts a failure and proactive moves are on; once per node and warning."""
        sign = str(fault.evidence.get("sign"))
        if sign not in _PREDICTIVE_SIGNS:
            return
        warning = f"{fault.evidence.get('gpu')}:{sign}:{fault.evidence.get('since')}"
        if (node.name, warning) in self._warned:
            return
        self._warned.add((node.name, warning))
        jobs = [r for r in await self.jobs.all() if runs_on(r, node.name)]
        names = ", ".join(r.name for r in jobs) or "none"
        if not self.proactive:
            self.ctx.log.warning(
                "node %s warns (%s); proactive moves are off (RESURGE_NODE_PROACTIVE_MOVES): "
                "jobs stay on it: %s",
                node.name, fault.message, names,
            )  # fmt: skip
            return
        self.ctx.log.warning(
            "node %s warns (%s): moving jobs off it at their next checkpoint: %s",
            node.name, fault.message, names,
        )  # fmt: skip
        words = f"node {node.name} warns of a failure: {fault.message}"
        evidence: dict[str, str | int | float | bool | None] = {
            "sign": sign, "gpu": fault.evidence.get("gpu"), "warning": fault.fault_id,
        }  # fmt: skip
        off = MoveOff(node.name, WARNING_REASON, words, warning, evidence)
        for record in jobs:
            self.ctx.spawn(self._move_warned(record, off), name=f"warned-off-{record.name}")

    async def _move_warned(self, record: JobRecord, off: MoveOff) -> None:
        said = await self.mover.move_off(record, off)
        self.ctx.log.info("job %s off warning node %s: %s", record.name, off.node, said)

    async def quarantine(self, node: NodeHealth) -> None:
        """Carry out ``node``'s new quarantine (a dry run's: log it only)."""
        held = node.quarantine
        assert held is not None
        jobs = [r for r in await self.jobs.all() if runs_on(r, node.name)]
        names = ", ".join(r.name for r in jobs) or "none"
        if held.dry_run:
            self.ctx.log.warning(
                "dry run: would quarantine node %s (score %.2f >= %g: %s) and move jobs off "
                "it: %s",
                node.name, held.score, held.threshold, held.why, names,
            )  # fmt: skip
            return
        self.ctx.log.warning(
            "quarantining node %s (score %.2f >= %g: %s); moving jobs off it: %s",
            node.name, held.score, held.threshold, held.why, names,
        )  # fmt: skip
        await self.backend.cordon(
            node.name, f"quarantined: score {held.score:.2f} >= {held.threshold:g}: {held.why}"
        )
        await self.nodes.mutate(node.name, lambda r: _note_jobs(r, [j.name for j in jobs]))
        for record in jobs:
            self.ctx.spawn(self._move_off(record, node), name=f"move-off-{record.name}")

    async def _move_off(self, record: JobRecord, node: NodeHealth) -> None:
        held = node.quarantine
        assert held is not None
        words = (
            f"node {node.name} is quarantined (score {held.score:.2f} >= "
            f"{held.threshold:g}: {held.why})"
        )
        off = MoveOff(
            node.name, QUARANTINE_REASON, words, held.since.isoformat(),
            {"score": held.score, "why": held.why},
        )  # fmt: skip
        said = await self.mover.move_off(record, off)
        self.ctx.log.info("job %s off quarantined node %s: %s", record.name, node.name, said)


class _NodeCollector(Collector):
    """Each node's score (decayed to the scrape) and quarantine, from ``records``."""

    def __init__(self, records: dict[str, NodeHealth], policy: NodePolicy) -> None:
        self.records = records
        self.policy = policy

    def collect(self) -> Iterator[Metric]:
        """``resurge_node_score`` and ``resurge_node_quarantined`` of every node."""
        now = datetime.now(UTC)
        score = GaugeMetricFamily(
            "resurge_node_score",
            "A node's fault score across jobs (decaying; quarantined at the threshold).",
            labels=["node"],
        )
        held = GaugeMetricFamily(
            "resurge_node_quarantined",
            "1 for a quarantined node, 0.5 for one a dry run would quarantine, else 0.",
            labels=["node"],
        )
        for name, record in list(self.records.items()):
            score.add_metric([name], current_score(record, now, self.policy))
            q = record.quarantine
            held.add_metric([name], 0.0 if q is None else 0.5 if q.dry_run else 1.0)
        yield score
        yield held


def _note_jobs(record: NodeHealth, jobs: list[str]) -> bool:
    if record.quarantine is None or record.quarantine.jobs == jobs:
        return False
    record.quarantine = record.quarantine.model_copy(update={"jobs": jobs})
    return True
