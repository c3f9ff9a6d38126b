"""A job trace on a shared cluster under the scaler's elastic decision.

Jobs arrive and leave at the trace's times (their work is not modelled: a job that grows
does not end sooner, so runs compare GPU-hours put to use). Every ``decision_seconds``
the scaler's own :func:`resurge.control.decisions.elastic_decision.plan` runs over the cluster and
every job's :class:`~resurge.control.decisions.elastic_decision.JobShape`, and its resizes are
carried out at once with :func:`~resurge.control.decisions.elastic_decision.applied`; a policy
with ``elastic: false`` holds each job at its ``min`` (one allowed size).

Failures: node-scope kinds only (the recovery ladder's costs are what single-job runs
measure). A node that fails is unschedulable for its ``repair_hours``; a job with a
replica there loses its training since its last checkpoint (``interval`` of running, and
one at every resize, as the scaler checkpoints first) and stalls, its GPU-time charged
to ``waiting``, until the decision shrinks it off the node (elastic jobs, after
``faulty_timeout``) or, for a fixed-size job, it is requeued (the restarter's move to a
free node is not modelled here) and admitted again when it fits. A resize stops the job
for the ``process`` rung's price (:mod:`.costs`) at its new size (``restart``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from resurge.control.decisions.elastic_decision import (
    Cluster,
    JobShape,
    Kind,
    Node,
    Phase,
    applied,
    plan,
)
from resurge.events import RecoveryLevel
from resurge.simulation.config import PolicyConfig, SimulationConfig, TraceJob
from resurge.simulation.failures import FailureStream
from resurge.simulation.results import Ledger

__all__ = ["TraceRun", "run_trace"]


@dataclass(slots=True)
class TraceRun:
    """GPU-seconds by cause over every job, GPU-seconds held, resizes, faults by kind."""

    ledger: Ledger
    held: float = 0.0
    resizes: int = 0
    faults: Counter[str] = field(default_factory=Counter)


def _shape(job: TraceJob, gpus_per_node: int, elastic: bool, now: float) -> JobShape:
    top = job.upper if elastic else job.min_replicas
    return JobShape(
        name=job.name,
        nproc=job.nproc or gpus_per_node,
        sizes=tuple(range(job.min_replicas, top + 1)),
        priority=job.priority,
        submitted=now,
    )


class _Trace:
    def __init__(self, config: SimulationConfig, policy: PolicyConfig) -> None:
        self.c = config
        self.elastic = policy.elastic
        self.interval = config.checkpoint_of(policy).interval_minutes * 60.0
        self.pricing = config.restart_cost(policy)
        g, n = config.cluster.gpus_per_node, config.cluster.nodes
        self.up = [Node(name=f"node-{i}", slots=g) for i in range(n)]
        self.down = [replace(node, schedulable=False) for node in self.up]
        self.away: dict[int, float] = {}  # node -> back at
        self.kinds = {k: v for k, v in config.failures.items() if v.scope == "node"}
        self.stream = FailureStream(self.kinds, n, g, scale=config.failure_rate_scale,
                                    seed=config.seed)  # fmt: skip
        self.shapes: dict[str, JobShape] = {}
        self.anchor: dict[str, float] = {}
        self.out = TraceRun(ledger=Ledger())

    def run(self) -> TraceRun:
        step = self.c.decision_seconds
        horizon = self.c.days * 86_400.0
        candidate = self.stream.after(0.0)
        now = 0.0
        while now < horizon:
            while candidate is not None and candidate.time <= now:
                self._fail(candidate.time, candidate.node, candidate.kind)
                candidate = self.stream.after(candidate.time)
            self._repairs(now)
            self._arrivals(now)
            self._decide(now)
            self._account(min(step, horizon - now))
            now += step
        return self.out

    def _fail(self, at: float, node: int, kind: str) -> None:
        if node in self.away:
            return
        self.away[node] = at + self.kinds[kind].repair_hours * 3600.0
        name = self.up[node].name
        for job, shape in list(self.shapes.items()):
            if shape.phase is not Phase.RUNNING or name not in shape.nodes:
                continue
            self.out.faults[kind] += 1
            gpus = shape.replicas * shape.nproc
            since = (at - self.anchor[job]) % self.interval
            self.out.ledger.charge("redone", since * gpus)
            self.out.ledger.charge("detection", self.kinds[kind].detection_seconds * gpus)
            if len(shape.sizes) == 1:  # fixed size: requeued, admitted again when it fits
                self.shapes[job] = replace(shape, phase=Phase.PENDING, nodes=(), lost={})
            else:
                self.shapes[job] = replace(shape, lost={**shape.lost, name: at})

    def _repairs(self, now: float) -> None:
        for node in [n for n, back in self.away.items() if back <= now]:
            del self.away[node]

    def _arrivals(self, now: float) -> None:
        gpus = self.c.cluster.gpus_per_node
        for job in self.c.trace or []:
            start, end = job.start_hours * 3600.0, (job.start_hours + job.hours) * 3600.0
            if job.name not in self.shapes and start <= now < end:
                self.shapes[job.name] = _shape(job, gpus, self.elastic, now)
            elif job.name in self.shapes and now >= end:
                del self.shapes[job.name]

    def _decide(self, now: float) -> None:
        nodes = tuple(self.down[i] if i in self.away else node for i, node in enumerate(self.up))
        decided = plan(Cluster(nodes=nodes), list(self.shapes.values()), now)
        for resize in decided.resizes:
            shape = applied(self.shapes[resize.job], resize, now)
            self.shapes[resize.job] = shape
            self.anchor[resize.job] = now
            if resize.kind is Kind.ADMIT:
                continue
            self.out.resizes += 1
            gpus = shape.replicas * shape.nproc
            pause = replace(self.pricing, ranks=gpus).seconds(RecoveryLevel.PROCESS)
            self.out.ledger.charge("restart", pause * gpus)

    def _account(self, seconds: float) -> None:
        ledger = self.out.ledger
        for shape in self.shapes.values():
            gpus = shape.replicas * shape.nproc
            if not gpus:
                continue
            self.out.held += gpus * seconds
            if shape.lost:
                ledger.charge("waiting", gpus * seconds)
        ledger.productive = max(self.out.held - sum(ledger.lost.values()), 0.0)


def run_trace(config: SimulationConfig, policy: PolicyConfig) -> TraceRun:
    """Replay ``config``'s trace under ``policy`` (see the module)."""
    if not config.trace:
        raise ValueError("the config has no trace")
    return _Trace(config, policy).run()
