"""One simulated job's record, kept and decided on as the restarter does.

:class:`RecoveryDesk` holds a :class:`~resurge.control.state.records.JobRecord` and hands
every fault to :func:`resurge.control.decisions.recovery_policy.apply_fault`, the restarter's own
function; checkpoints, worker starts and first steps go through the restarter's
:func:`~resurge.control.decisions.recovery_policy.apply_checkpoint`,
:func:`~resurge.control.decisions.recovery_policy.mark_dispatched` and
:func:`~resurge.control.decisions.recovery_policy.apply_sign_of_life`, and a start through the
scaler's :func:`resurge.control.decisions.admission.start`. Nothing here decides.

The record is a projection: it lists only the placement of the replica a fault is about
(set before each call), not one per node, so a decision costs the same at 16 nodes as
at 16,384. For one replica per node (``nproc`` equal to the node's slots) that gives the
decision the full record would: the ladder reads the placement of the fault's replica,
the job's history, generation, progress and its spare and avoided nodes; a node move
looks only at nodes with free slots, and a node the job fills has none, so the caller
passes the free nodes alone. What the record says about other replicas (incarnations,
the replicas a ``job`` restart recreates) is output the simulator does not read.

Times are simulated seconds; the policy sees them as datetimes from :data:`EPOCH`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from resurge.cluster import NodeInfo
from resurge.contract.vocabulary import RecoveryLevel
from resurge.control.decisions.admission import start
from resurge.control.decisions.ladder import LADDER, SCOPE_FLOOR
from resurge.control.decisions.recovery_policy import (
    ClusterView,
    Verdict,
    apply_checkpoint,
    apply_fault,
    apply_progress_capability,
    apply_sign_of_life,
    mark_dispatched,
)
from resurge.control.state.records import JobRecord, Placement
from resurge.events import FaultDetected, FaultScope, JobPhase, Source
from resurge.jobspec import TrainingJob, parse_job
from resurge.jobspec.recovery import RecoverySpec

__all__ = ["EPOCH", "FaultInput", "Outcome", "RecoveryDesk", "at"]

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
"""Simulated second 0."""

_SOURCE = Source(service="simulator", instance="simulator")


def at(seconds: float) -> datetime:
    """The datetime of simulated second ``seconds``."""
    return EPOCH + timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class FaultInput:
    """A fault as a detector would report it: its kind (the reason), scope and lowest
    rung, where it is, and the generation it hit."""

    fault_id: str
    reason: str
    scope: FaultScope
    lowest_rung: RecoveryLevel
    replica: int
    node: str
    rank: int | None
    generation: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the restarter decided: the verdict, the rung, replicas moved (replica, from,
    to), whether the job waits for capacity, and when the restart may start (seconds)."""

    verdict: Verdict
    why: str
    level: RecoveryLevel | None = None
    moves: tuple[tuple[int, str, str], ...] = ()
    requeue: bool = False
    start_at: float = 0.0


def _job(name: str, recovery: RecoverySpec, nproc: int) -> TrainingJob:
    spec = {"command": ["train"], "nprocPerNode": nproc}
    job = parse_job({"metadata": {"name": name}, "spec": spec})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"recovery": recovery})})


class RecoveryDesk:
    """A job's record and the restarter's decisions on it (see the module)."""

    def __init__(
        self, name: str, recovery: RecoverySpec, nproc: int, *, in_process_capable: bool
    ) -> None:
        self.job = _job(name, recovery, nproc)
        self.in_process_capable = in_process_capable
        self.record = self._fresh(0.0)

    def _fresh(self, now: float) -> JobRecord:
        record = JobRecord(name=self.job.name, spec=self.job, submitted=at(now), updated=at(now))
        apply_progress_capability(record, self.in_process_capable)
        return record

    @property
    def generation(self) -> int:
        """The record's generation."""
        return self.record.generation

    @property
    def failed(self) -> bool:
        """Whether the policy failed the job (a limit spent)."""
        return self.record.phase is JobPhase.FAILED

    @property
    def spare_nodes(self) -> list[str]:
        """Spare nodes the record still holds."""
        return self.record.spare_nodes

    @property
    def avoid_nodes(self) -> list[str]:
        """Nodes the job no longer uses."""
        return self.record.avoid_nodes

    def resume_step(self) -> int:
        """The checkpoint step the current generation resumed from (0: from scratch)."""
        return self.record.resume_step or 0

    def start(self, now: float, replica: int, node: str, spares: list[str]) -> None:
        """Start the job (a failed one is submitted again: a new record) on ``spares``
        and placements of which ``replica`` on ``node`` stands for all."""
        if self.failed:
            checkpoint = self.record.latest_checkpoint
            self.record = self._fresh(now)
            self.record.latest_checkpoint = checkpoint
        start(self.record, [Placement(replica=replica, node=node)], spares)

    def checkpoint(self, step: int) -> None:
        """Every rank reports checkpoint ``step`` saved (no-op if not newer)."""
        latest = self.record.latest_checkpoint
        if step <= 0 or (latest is not None and step <= latest.step):
            return
        if not self.record.placements:
            return
        generation, world = self.record.generation, self.record.world_size
        for rank in range(world):
            path = f"checkpoint-{step}"
            apply_checkpoint(self.record, rank, step, path, generation=generation, world_size=world)

    def fault(
        self, now: float, fault: FaultInput, free_nodes: list[NodeInfo], replica_node: str
    ) -> Outcome:
        """Decide ``fault`` with the restarter's policy. ``free_nodes``: schedulable nodes
        with no replica of the job (spares included); ``replica_node``: where the fault's
        replica runs now (a node fault elsewhere is about a node the job left)."""
        if self.record.placements or self.record.phase is not JobPhase.PENDING:
            self.record.placements = [Placement(replica=fault.replica, node=replica_node)]
        self.record.incarnations = {}
        floor = SCOPE_FLOOR[fault.scope]
        above = LADDER.index(fault.lowest_rung) > LADDER.index(floor)
        suggested = fault.lowest_rung if above else None
        event = FaultDetected(
            fault_id=fault.fault_id,
            scope=fault.scope,
            reason=fault.reason,
            suggested_level=suggested,
            job=self.job.name,
            replica=fault.replica,
            node=fault.node,
            rank=fault.rank,
            generation=fault.generation,
            time=at(now),
            source=_SOURCE,
        )
        decision = apply_fault(
            self.record, event, now=at(now), cluster=ClusterView(nodes=free_nodes, used={})
        )
        plan = self.record.pending_recovery
        if decision.verdict is not Verdict.RESTART or plan is None:
            return Outcome(decision.verdict, decision.why)
        return Outcome(
            verdict=decision.verdict,
            why=decision.why,
            level=decision.level,
            moves=tuple((m.replica, m.from_node, m.to_node) for m in plan.moves),
            requeue=plan.requeue,
            start_at=(plan.start_at - EPOCH).total_seconds(),
        )

    def uncordon(self, node: str) -> None:
        """A repaired node is fit again: the job may use it (``resurge node uncordon``)."""
        if node in self.record.avoid_nodes:
            self.record.avoid_nodes = [n for n in self.record.avoid_nodes if n != node]

    def started(self, now: float) -> None:
        """The restart was carried out and the new generation's workers started."""
        mark_dispatched(self.record, self.record.generation)
        apply_sign_of_life(self.record, self.record.generation, at(now), progress=False)

    def stepped(self, now: float) -> None:
        """The new generation completed its first step past its resume point."""
        step = self.resume_step() + 1
        apply_sign_of_life(self.record, self.record.generation, at(now), progress=True, step=step)
