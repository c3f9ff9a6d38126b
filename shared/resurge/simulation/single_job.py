"""One fixed-size job on a cluster with failures: a discrete-event run on a simulated clock.

The job runs one replica on every node but the spares (``nproc`` = the node's GPUs) and
trains in cycles: ``interval`` seconds of steps, then a checkpoint write of ``write``
seconds that stops training. A failure (:mod:`.failures`) on a node the job runs on:

- a node-scope kind takes the node away for its ``repair_hours`` (then it is fit again,
  uncordoned) and stops the job; it is seen ``detection_seconds`` later, stamped with
  the generation running then (a node that died during a restart fails the restart's
  generation, as its agent does);
- a process-scope kind stops the job, only while it trains (no process runs during a
  restart), and is stamped with the generation it hit.

On detection the restarter's policy decides (:class:`.RecoveryDesk`): ignore, restart at
a rung (moving replicas off bad nodes, spares first), requeue (no node to move to: wait
until the job fits again, replicas and spares, then start as a full restart), or fail
(a limit spent: the job is submitted again, as an operator would, and waits the same
way). A restart costs its rung's seconds after any backoff; it fails if a replica's
node is still away (the node is reported again, so the policy escalates). The new
generation's first step (``step_seconds``) tells the policy the restart worked.

With checkpointless recovery (a policy's ``peer_recovery``) the job also snapshots its
state to memory every step, each step costing ``snapshot_overhead`` more. A failure then
loses only the step in flight: the restart resumes from the newest live step, unless the
recovery took every copy of some state (:class:`.PeerCopies`: nodes lost, worker groups
recreated at the ``pod`` or ``job`` rung unless ``recreated_groups_keep_memory``,
replicas moved or released), when it resumes
from the disk checkpoint as without it. Training since the last disk checkpoint is kept
only in memory until the next write, so such a fall back redoes all of it. A restart
that resumes from live copies where some replica lost its memory costs the peer transfer
of its state (``state_mb`` at ``bandwidth_gbps``) on top of its rung's seconds.

Time is charged by cause (:class:`.Ledger`): training kept is productive; training since
the last checkpoint (with peer recovery, the step in flight, or all of it when the
recovery falls back to the disk) when a failure stops it is ``redone``; the snapshots'
share of each step, ``snapshot``; checkpoint writes; from a
failure to its detection, ``detection``; from a decision to training again (backoff
included), ``restart``; requeued or resubmitted until the job fits, ``waiting``. The
cost of a run is a few operations per failure and per restart, not per node or per step.

Nodes that keep failing (:mod:`.node_health`): with ``cluster.bad_nodes`` a few nodes
fail more often by the kinds that count against a node (the fleet's mean rate held).
With a policy's ``quarantine``, each such fault raises its node's decaying score; at the
threshold the node leaves the pool: away for the quarantine's hours (its repair
included), a replica there reported as a node fault so that the policy moves it off at
the node rung (priced by the cost model as any node move), then back after a health
check, fixed or not. With ``proactive_moves``, a fault that warning signs announce
(``predictable_fraction`` of a kind's) on a node of the training job is preceded by a
planned move: a checkpoint written at once (``checkpoint``: nothing since the last one
is lost) and the replica moved to a free node at the node rung's price (``restart``),
then the fault happens to the node the job left; without a free node, or while the job
is not training, the fault hits the job as any other.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from resurge.cluster import NodeInfo
from resurge.control.decisions.ladder import LADDER, rung
from resurge.control.decisions.recovery_policy import Verdict
from resurge.events import FaultScope, RecoveryLevel
from resurge.jobspec.recovery import RecoverySpec
from resurge.simulation.config import (
    BadNodes,
    FailureKind,
    PeerRecoveryConfig,
    QuarantineConfig,
    SimulationConfig,
)
from resurge.simulation.costs import Pricing, Resume
from resurge.simulation.failures import Candidate, FailureStream
from resurge.simulation.node_health import NodeHealth, rate_multipliers
from resurge.simulation.peer_copies import PeerCopies
from resurge.simulation.recovery_desk import EPOCH, FaultInput, Outcome, RecoveryDesk
from resurge.simulation.results import Ledger

__all__ = ["JobRun", "JobSettings", "run_job"]

_RUNNING, _DETECTION, _RESTART, _WAITING = "running", "detection", "restart", "waiting"
_DETECT, _RESTART_DONE, _FIRST_STEP, _REPAIR, _MOVE_DONE = range(5)


@dataclass(frozen=True, slots=True)
class JobSettings:
    """What one run needs: the cluster and its failures, the policy and its costs."""

    nodes: int
    gpus_per_node: int
    spares: int
    days: float
    failures: dict[str, FailureKind]
    failure_rate_scale: float
    recovery: RecoverySpec
    pricing: Pricing
    """Seconds of a restart by rung and where it reads the state from (:mod:`.costs`)."""
    interval: float
    """Seconds of training between checkpoints."""
    write: float
    """Seconds one checkpoint write stops training."""
    step_seconds: float
    seed: int
    peer: PeerRecoveryConfig | None = None
    """Checkpointless recovery from live copies; None: every restart reads the disk."""
    bad_nodes: BadNodes | None = None
    quarantine: QuarantineConfig | None = None
    proactive: bool = False
    """Planned moves off a node before a predicted fault."""

    @staticmethod
    def of(config: SimulationConfig, policy_index: int) -> JobSettings:
        """The settings of ``config``'s policy number ``policy_index``."""
        policy = config.policies[policy_index]
        checkpoint = config.checkpoint_of(policy)
        peer = policy.peer_recovery
        return JobSettings(
            nodes=config.cluster.nodes,
            gpus_per_node=config.cluster.gpus_per_node,
            spares=config.cluster.spares,
            days=config.days,
            failures=dict(config.failures),
            failure_rate_scale=config.failure_rate_scale,
            recovery=policy.recovery,
            pricing=replace(
                config.restart_cost(policy),
                peer_seconds=None if peer is None else peer.restore_seconds(config.costs),
            ),
            interval=checkpoint.interval_minutes * 60.0,
            write=checkpoint.write_seconds,
            step_seconds=config.step_seconds,
            seed=config.seed,
            peer=peer,
            bad_nodes=config.cluster.bad_nodes,
            quarantine=policy.quarantine,
            proactive=policy.proactive_moves,
        )


@dataclass(frozen=True, slots=True)
class _Detect:
    kind: str
    replica: int
    node: int
    rank: int | None
    generation: int | None  # None: the generation running when it is seen


@dataclass(slots=True)
class JobRun:
    """The outcome of one run: the ledger (seconds of the job's wall time), restarts by
    rung, faults by kind, how often the policy failed the job, each recovery (where it
    resumed from, ``live`` copies or ``disk``, and what it redid), and every decision in
    order (the fault as the policy saw it, and the outcome)."""

    replicas: int
    ledger: Ledger
    restarts: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    job_failures: int = 0
    recoveries: list[tuple[str, float]] = field(default_factory=list)
    """Per recovery, in order: where it resumed from and the training seconds it redid."""
    decisions: list[tuple[float, FaultInput, Outcome]] = field(default_factory=list)
    moves: list[tuple[str, float]] = field(default_factory=list)
    """Per planned move (proactive), as ``recoveries``."""
    nodes: dict[str, int] = field(default_factory=dict)
    """Nodes' record (:attr:`.NodeHealth.counts`, and ``bad_nodes``); empty without
    bad nodes, quarantine or proactive moves."""


def _name(index: int) -> str:
    return f"node-{index}"


class _Script:
    """Scripted failures in place of the random stream: each candidate once, in order."""

    def __init__(self, candidates: Sequence[Candidate]) -> None:
        self.candidates = sorted(candidates, key=lambda c: c.time)

    def after(self, now: float) -> Candidate | None:
        return next((c for c in self.candidates if c.time > now), None)


class _Simulation:
    """The state of one run (see the module); :meth:`run` runs it to the end."""

    def __init__(
        self, settings: JobSettings, keep_decisions: bool, script: Sequence[Candidate] | None
    ) -> None:
        self.s = settings
        self.keep = keep_decisions
        self.replicas = settings.nodes - settings.spares
        recovery = settings.recovery
        self.held = recovery.spares
        capable = RecoveryLevel.IN_PROCESS in recovery.levels
        self.desk = RecoveryDesk("simulated", recovery, settings.gpus_per_node,
                                 in_process_capable=capable)  # fmt: skip
        self.health: NodeHealth | None = None
        weights = None
        if settings.bad_nodes or settings.quarantine or settings.proactive:
            multipliers = rate_multipliers(settings.nodes, self.replicas, settings.bad_nodes,
                                           settings.seed)  # fmt: skip
            self.health = NodeHealth(multipliers, settings.quarantine,
                                     proactive=settings.proactive, seed=settings.seed)  # fmt: skip
            weights = multipliers if settings.bad_nodes else None
        self.stream: FailureStream | _Script = FailureStream(
            settings.failures, settings.nodes, settings.gpus_per_node,
            scale=settings.failure_rate_scale, seed=settings.seed, weights=weights,
        ) if script is None else _Script(script)  # fmt: skip
        self.write_until = 0.0  # a planned move's checkpoint write ends then
        self.out = JobRun(replicas=self.replicas, ledger=Ledger())
        self.horizon = settings.days * 86_400.0
        self.node_replica = list(range(self.replicas)) + [-1] * settings.spares
        self.replica_node = list(range(self.replicas))
        self.away: dict[int, str] = {}  # node -> the kind that took it away
        self.idle = set(range(self.replicas, settings.nodes))
        self.dead: set[int] = set()  # nodes away that still hold a replica
        self.undetected: dict[int, int] = {}  # node -> node faults there not yet seen
        self.pending = 0  # detections scheduled, not yet handled
        self.infos: dict[int, NodeInfo] = {}
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.fault_ids = itertools.count()
        self.mode = _RUNNING
        self.mark = 0.0
        self.segment = 0.0  # when training (re)started
        self.committed = 0.0  # training seconds kept by the last checkpoint
        self.unsaved = 0.0  # training seconds since then, kept only in memory
        self.phase = 0.0  # training seconds into the checkpoint interval when it (re)started
        self.redoing = 0.0  # training seconds this recovery has redone so far
        peer = settings.peer
        self.copies = PeerCopies(peer.state, self.replicas) if peer is not None else None
        self.overhead = peer.snapshot_overhead if peer is not None else 0.0
        self.step = settings.step_seconds * (1.0 + self.overhead)
        self.epoch = 0
        spares = sorted(self.idle)[: self.held]
        self.desk.start(0.0, 0, _name(0), [_name(i) for i in spares])
        self.desk.started(0.0)
        self.desk.stepped(0.0)

    # the clock

    def _at(self, time: float, what: int, payload: object = None) -> None:
        heapq.heappush(self.events, (time, next(self.seq), what, payload))

    def run(self) -> JobRun:
        """Run to the horizon; the outcome."""
        candidate = self.stream.after(0.0)
        while True:
            head = self.events[0][0] if self.events else math.inf
            if candidate is not None and candidate.time < min(head, self.horizon):
                self._candidate(candidate)
                candidate = self.stream.after(candidate.time)
                continue
            if head >= self.horizon:
                self._finish()
                return self.out
            time, _, what, payload = heapq.heappop(self.events)
            if what == _DETECT:
                assert isinstance(payload, _Detect)
                self._detect(time, payload)
            elif what == _RESTART_DONE:
                self._restart_done(time, payload)
            elif what == _MOVE_DONE:
                self._restart_done(time, payload, planned=True)
            elif what == _FIRST_STEP:
                if payload == self.epoch and self.mode == _RUNNING:
                    self.desk.stepped(time)
            else:
                assert isinstance(payload, int)
                self._repaired(time, payload)

    # time accounting

    def _switch(self, now: float, mode: str) -> None:
        if self.mode != _RUNNING:
            start = self.mark
            if self.write_until > start:
                split = min(now, self.write_until)
                self.out.ledger.charge("checkpoint", split - start)
                start = split
            self.out.ledger.charge(self.mode, now - start)
        self.mark = now
        self.mode = mode

    def _kept(self, seconds: float) -> None:
        """``seconds`` of training are kept for good: productive, less the snapshots'."""
        ledger = self.out.ledger
        if self.overhead:
            ledger.charge("snapshot", seconds * self.overhead / (1.0 + self.overhead))
            seconds /= 1.0 + self.overhead
        ledger.productive += seconds

    def _trained(self, now: float, stopped: bool) -> None:
        """Charge the training segment up to ``now``; ``stopped``: by a failure (training
        since the last checkpoint is lost, with peer recovery only the step in flight
        unless the recovery falls back to the disk) rather than by the end of the run."""
        s, ledger = self.s, self.out.ledger
        # the segment on the checkpoint cycle's clock, which a live resume does not reset
        elapsed = self.phase + now - self.segment
        cycles = math.floor(elapsed / (s.interval + s.write))
        rest = elapsed - cycles * (s.interval + s.write)
        ledger.charge("checkpoint", cycles * s.write + max(rest - s.interval, 0.0))
        if cycles:
            kept = self.unsaved + cycles * s.interval - self.phase
            self._kept(kept)
            self.committed += kept
            self.unsaved = min(rest, s.interval)
        else:
            self.unsaved += min(rest, s.interval) - self.phase
        self.phase = 0.0
        if not stopped:
            self._kept(self.unsaved)
            self.committed += self.unsaved
            self.unsaved = 0.0
            return
        self.desk.checkpoint(int(self.committed / s.step_seconds))
        if self.copies is None:
            lost = self.unsaved
        else:
            # the step in flight; the steps before it are live in memory
            lost = min(min(rest, s.interval) % self.step, self.unsaved)
            if rest < s.interval:
                self.phase = rest - lost
        ledger.charge("redone", lost)
        self.unsaved -= lost
        self.redoing = lost

    def _halt(self, now: float) -> None:
        if self.mode == _RUNNING:
            self._trained(now, stopped=True)
            self._switch(now, _DETECTION)

    def _finish(self) -> None:
        if self.mode == _RUNNING:
            self._trained(self.horizon, stopped=False)
        else:
            self._switch(self.horizon, self.mode)
        if self.health is not None:
            self.out.nodes = {"bad_nodes": len(self.health.bad), **self.health.counts}

    # failures

    def _candidate(self, c: Candidate) -> None:
        kind = self.s.failures[c.kind]
        node, now = c.node, c.time
        if node in self.away:
            return
        health = self.health if kind.counts_against_node else None
        if health is not None and not health.accepts(node):
            return
        replica = self.node_replica[node]
        if kind.scope == "process" and (replica < 0 or self.mode != _RUNNING):
            return
        quarantine = moved = False
        if health is not None:
            quarantine = health.fault(now, node)
            moved = replica >= 0 and self._announced(now, health, kind, replica, node)
        if kind.scope == "node" or quarantine:
            self.away[node] = c.kind
            self.idle.discard(node)
            hours = kind.repair_hours if kind.scope == "node" else 0.0
            if quarantine and self.s.quarantine is not None:
                hours = max(hours, self.s.quarantine.hours)
            self._at(now + hours * 3600.0, _REPAIR, node)
        elif moved:
            self.idle.add(node)
        if replica >= 0 and not moved:
            self._hit(c, kind, replica, quarantine)

    def _announced(
        self, now: float, health: NodeHealth, kind: FailureKind, replica: int, node: int
    ) -> bool:
        """Whether warning signs announced this fault and the job moved off ``node``."""
        if self.mode != _RUNNING or not health.predicted(kind):
            return False
        health.counts["predicted"] += 1
        return self._planned_move(now, replica, node)

    def _hit(self, c: Candidate, kind: FailureKind, replica: int, quarantine: bool) -> None:
        """The fault ``c`` stops the job (its node's replica ``replica``)."""
        node, now = c.node, c.time
        if kind.scope == "node":
            self.dead.add(node)
            if self.copies is not None:
                self.copies.lose(replica)
            self.undetected[node] = self.undetected.get(node, 0) + 1
            generation = None
        else:
            if quarantine:
                self.dead.add(node)
            generation = self.desk.generation
        self.out.faults[c.kind] += 1
        self._halt(now)
        rank = replica * self.s.gpus_per_node + c.gpu if kind.scope == "process" else None
        self.pending += 1
        self._at(now + kind.detection_seconds, _DETECT,
                 _Detect(c.kind, replica, node, rank, generation))  # fmt: skip

    def _detect(self, now: float, d: _Detect) -> None:
        self.pending -= 1
        if d.generation is None:
            self.undetected[d.node] -= 1
        kind = self.s.failures[d.kind]
        node_scope, lowest, rank = kind.scope == "node", kind.lowest_rung, d.rank
        if self.health is not None and d.node in self.health.quarantined:
            # quarantined: the job leaves the node
            node_scope, rank = True, None
            lowest = LADDER[max(LADDER.index(lowest), LADDER.index(RecoveryLevel.NODE))]
        fault = FaultInput(
            fault_id=f"fault-{next(self.fault_ids)}",
            reason=d.kind,
            scope=FaultScope.NODE if node_scope else FaultScope.PROCESS,
            lowest_rung=lowest,
            replica=d.replica,
            node=_name(d.node),
            rank=rank,
            generation=self.desk.generation if d.generation is None else d.generation,
        )
        here = _name(self.replica_node[d.replica])
        outcome = self.desk.fault(now, fault, self._free(), here)
        if self.keep:
            self.out.decisions.append((now, fault, outcome))
        if outcome.verdict is Verdict.FAIL:
            self.out.job_failures += 1
            self._requeue(now)
        elif outcome.verdict is Verdict.RESTART and outcome.level is not None:
            self._restart(now, outcome, outcome.level, d.replica)
        elif self.mode == _DETECTION and self.pending == 0:
            self._resume(now)  # nothing to restart: the job goes on

    def _free(self) -> list[NodeInfo]:
        slots = self.s.gpus_per_node
        infos = self.infos
        for i in self.idle:
            if i not in infos:
                infos[i] = NodeInfo(name=_name(i), slots=slots, heartbeat=EPOCH)
        return [infos[i] for i in sorted(self.idle)]

    # recoveries

    def _restart(self, now: float, outcome: Outcome, level: RecoveryLevel, faulty: int) -> None:
        self.out.restarts[level.value] += 1
        copies, peer = self.copies, self.s.peer
        if copies is not None and peer is not None:
            recreates = "none" if peer.recreated_groups_keep_memory else rung(level).recreates
            if recreates == "all":
                copies.lose_all()
            elif recreates == "faulty":
                copies.lose(faulty)
            for moved, _, _ in outcome.moves:
                copies.lose(moved)
        for replica, from_node, to_node in outcome.moves:
            old, new = int(from_node.rsplit("-", 1)[1]), int(to_node.rsplit("-", 1)[1])
            self.node_replica[old] = -1
            self.dead.discard(old)
            if old not in self.away:
                self.idle.add(old)
            self.replica_node[replica] = new
            self.node_replica[new] = replica
            self.idle.discard(new)
        if outcome.requeue:
            self._requeue(now)
            return
        self._switch(now, _RESTART)
        self.epoch += 1
        resume: Resume = "disk"
        if copies is not None and copies.complete():
            # a new or recreated replica fetches its state from a peer
            resume = "peer" if copies.any_lost() else "memory"
        begin = max(now, outcome.start_at) + self.s.pricing.seconds(level, resume)
        self._at(begin, _RESTART_DONE, self.epoch)

    def _requeue(self, now: float) -> None:
        """Every replica released; wait until the job and its spares fit again."""
        for node in self.replica_node:
            self.node_replica[node] = -1
            if node not in self.away:
                self.idle.add(node)
        self.dead.clear()
        if self.copies is not None:
            self.copies.lose_all()
        self.epoch += 1
        self._switch(now, _WAITING)
        self._admit(now)

    def _admit(self, now: float) -> None:
        """Start a waiting job where it and its spares fit (the scaler's rule)."""
        avoid = set(self.desk.avoid_nodes)
        fit = sorted(i for i in self.idle if _name(i) not in avoid)
        if len(fit) < self.replicas + self.held:
            return
        self.replica_node = fit[: self.replicas]
        for replica, node in enumerate(self.replica_node):
            self.node_replica[node] = replica
        spares = fit[self.replicas : self.replicas + self.held]
        self.idle.difference_update(self.replica_node)
        self.desk.start(now, 0, _name(self.replica_node[0]), [_name(i) for i in spares])
        self._switch(now, _RESTART)
        self.epoch += 1
        self._at(now + self.s.pricing.seconds(RecoveryLevel.JOB), _RESTART_DONE, self.epoch)

    def _planned_move(self, now: float, replica: int, node: int) -> bool:
        """Checkpoint now and move ``replica`` off ``node`` to a free node (not a spare the
        policy holds); False where there is none."""
        avoid = {*self.desk.avoid_nodes, *self.desk.spare_nodes}
        target = next((i for i in sorted(self.idle) if _name(i) not in avoid), None)
        if target is None:
            return False
        assert self.health is not None
        self.health.counts["planned_moves"] += 1
        self._trained(now, stopped=False)
        self.desk.checkpoint(int(self.committed / self.s.step_seconds))
        self.node_replica[node] = -1
        self.replica_node[replica] = target
        self.node_replica[target] = replica
        self.idle.discard(target)
        resume: Resume = "disk"
        if self.copies is not None:
            self.copies.lose(replica)
            resume = "peer" if self.copies.complete() else "disk"
        self._switch(now, _RESTART)
        self.write_until = now + self.s.write
        self.epoch += 1
        done = self.write_until + self.s.pricing.seconds(RecoveryLevel.NODE, resume)
        self._at(done, _MOVE_DONE, self.epoch)
        return True

    def _restart_done(self, now: float, epoch: object, planned: bool = False) -> None:
        if epoch != self.epoch or self.mode != _RESTART:
            return
        if self.dead:
            # A replica's node is still away: the restart fails there; the node is
            # reported again unless a report of it is on its way.
            for node in sorted(self.dead):
                if not self.undetected.get(node):
                    kind = self.away[node]
                    self.pending += 1
                    self._at(now, _DETECT, _Detect(kind, self.node_replica[node], node, None, None))
                    self.undetected[node] = self.undetected.get(node, 0) + 1
                    self.out.faults[kind] += 1
            return
        if not planned:
            self.desk.started(now)
        self._resume(now, planned)

    def _resume(self, now: float, planned: bool = False) -> None:
        if self.copies is not None and self.copies.complete():
            origin = "live"
        else:
            # no live copy of some state: back to the disk checkpoint
            origin = "disk"
            self.out.ledger.charge("redone", self.unsaved)
            self.redoing += self.unsaved
            self.unsaved = self.phase = 0.0
        if self.copies is not None:
            self.copies.start_over()
        (self.out.moves if planned else self.out.recoveries).append((origin, self.redoing))
        self.redoing = 0.0
        self._switch(now, _RUNNING)
        self.segment = now
        self._at(now + self.s.step_seconds, _FIRST_STEP, self.epoch)

    def _repaired(self, now: float, node: int) -> None:
        if self.health is not None and node in self.health.quarantined:
            self.health.returned(node)
        self.away.pop(node)
        self.desk.uncordon(_name(node))
        if self.node_replica[node] >= 0:
            self.dead.discard(node)
        else:
            self.idle.add(node)
        if self.mode == _WAITING:
            self._admit(now)


def run_job(
    settings: JobSettings,
    *,
    keep_decisions: bool = False,
    script: Sequence[Candidate] | None = None,
) -> JobRun:
    """Simulate one job under ``settings`` (see the module); ``keep_decisions`` records
    every decision the policy made, in order; ``script``: these failure candidates
    (accepted or dropped as the random ones are) instead of the seeded stream."""
    return _Simulation(settings, keep_decisions, script).run()
