"""One snapshot of the cluster for every placement decision and every view.

:func:`build_snapshot` (pure) and :func:`read_snapshot` (which reads the backend, the
job records and the allocation ledger, then calls it) are the only place that works
out which slots of which node are in use. Admission, the restarter's moves, the
elastic decision, the scaler's GPU gauges and ``resurge node list`` all read a
:class:`ClusterSnapshot`.

A node's slots are in use by, each counted once however many of these name it:

- a replica placement of a job record that is neither Pending nor finished (Running,
  Recovering, Resizing; a move written into the record already names its new node);
- a spare node such a record holds for its job;
- a worker group the backend lists (a grow's replica warming up before any record
  names it, a finished job's group not yet deleted, a moved replica's old group);
- a live claim of the allocation ledger (:mod:`resurge.control.state.allocations`): a
  placement decided and not yet written into its record (an admission, a grow in
  flight, a move);
- what pods resurge did not create take there (:attr:`NodeInfo.in_use_elsewhere`:
  on Kubernetes, other teams' pods), the use ``(ELSEWHERE, None, node)``.

Besides the slots, a job may use only the nodes its backend lets its worker groups
onto: :attr:`ClusterSnapshot.unfit` holds, for each unfinished job, the nodes it may
not use and why (:meth:`~resurge.cluster.ClusterBackend.unfit_nodes`: on Kubernetes,
its template's ``nodeSelector``, required node affinity and tolerations), and
:meth:`ClusterSnapshot.nodes_for` the live nodes it may.

A replica is the key ``(job, replica, node)``, a spare ``(job, node)``: a claim, the
worker group and the record placement of one replica are one use of the node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from resurge.cluster import ClusterBackend, NodeInfo, WorkerGroupSpec
from resurge.control.decisions.recovery_policy import ClusterView
from resurge.control.state.allocations import Allocations, Claim
from resurge.control.state.records import JobRecord
from resurge.events import JobPhase
from resurge.jobspec import TrainingJob

__all__ = [
    "ELSEWHERE",
    "ClusterReads",
    "ClusterSnapshot",
    "RecordSource",
    "Use",
    "build_snapshot",
    "move_view",
    "read_snapshot",
]

Use = tuple[str, int | None, str]
"""One use of a node: (job, replica or None for a held spare, node)."""

ELSEWHERE = ""
"""The job of a use by pods resurge did not create (no job is named so)."""


@dataclass(frozen=True)
class ClusterSnapshot:
    """Nodes and every use of their slots at one moment.

    ``nodes``: the live nodes (the only ones a placement may use); ``known``: every node
    the backend lists (live or not). ``uses`` maps each use to the slots it takes;
    ``from_records`` holds the uses a job record names (its placements and spares).
    ``claims``: the ledger's live claims the snapshot counted, and ``revision``: the
    ledger revision it read (a placement is written against it). ``records``: the job
    records it was built from. ``unfit``: for each unfinished job, the nodes it may not
    use, each with why.
    """

    nodes: list[NodeInfo] = field(default_factory=list)
    known: list[NodeInfo] = field(default_factory=list)
    uses: dict[Use, int] = field(default_factory=dict)
    from_records: frozenset[Use] = frozenset()
    claims: tuple[Claim, ...] = ()
    revision: int = 0
    records: tuple[JobRecord, ...] = ()
    unfit: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def nodes_for(self, job: str) -> list[NodeInfo]:
        """The live nodes ``job`` may use (those :attr:`unfit` for it left out)."""
        unfit = self.unfit.get(job)
        return [n for n in self.nodes if n.name not in unfit] if unfit else list(self.nodes)

    def used(self, exclude_job: str | None = None) -> dict[str, int]:
        """Slots in use on each node (``exclude_job``'s uses left out)."""
        used: dict[str, int] = {}
        for (job, _, node), slots in self.uses.items():
            if job != exclude_job:
                used[node] = used.get(node, 0) + slots
        return used

    def reserved(self) -> dict[str, int]:
        """Slots in use on each node by what no job record names yet (a grow warming up,
        a claim not yet written, a group not yet deleted): what a decision over the
        records alone must not hand out."""
        reserved: dict[str, int] = {}
        for use, slots in self.uses.items():
            if use not in self.from_records:
                reserved[use[2]] = reserved.get(use[2], 0) + slots
        return reserved

    def jobs_on(self, node: str) -> list[str]:
        """The jobs with a replica on ``node`` (placed, grouped or claimed; a spare held
        there is not one), sorted."""
        return sorted({job for job, replica, at in self.uses if at == node and replica is not None})

    def claimed_jobs(self) -> set[str]:
        """Jobs with a placement claimed and not yet written (a resize in flight)."""
        return {claim.job for claim in self.claims}

    def free(self, exclude_job: str | None = None) -> dict[str, int]:
        """Free slots of each schedulable live node (``exclude_job``'s uses counted free)."""
        used = self.used(exclude_job)
        return {n.name: n.slots - used.get(n.name, 0) for n in self.nodes if n.schedulable}


def _holds_slots(record: JobRecord) -> bool:
    return record.phase is not JobPhase.PENDING and not record.phase.finished


def build_snapshot(
    nodes: Sequence[NodeInfo],
    records: Iterable[JobRecord],
    groups: Iterable[WorkerGroupSpec] = (),
    claims: Iterable[Claim] = (),
    *,
    known: Sequence[NodeInfo] | None = None,
    revision: int = 0,
    unfit: Mapping[str, Mapping[str, str]] | None = None,
) -> ClusterSnapshot:
    """The snapshot of live ``nodes`` with the uses of ``records``, ``groups``,
    ``claims`` and other pods (the module's list). ``known``: every listed node
    (default ``nodes``); ``unfit``: the nodes each job may not use, with why."""
    records = tuple(records)
    uses: dict[Use, int] = {}
    for info in nodes if known is None else known:
        if info.in_use_elsewhere:
            uses[(ELSEWHERE, None, info.name)] = info.in_use_elsewhere
    named: set[Use] = set()
    for record in records:
        if not _holds_slots(record):
            continue
        nproc = record.spec.spec.nproc_per_node
        for p in record.placements:
            named.add((record.name, p.replica, p.node))
            uses[(record.name, p.replica, p.node)] = nproc
        for node in record.spare_nodes:
            named.add((record.name, None, node))
            uses[(record.name, None, node)] = nproc
    for group in groups:
        uses.setdefault((group.job, group.replica, group.node), group.nproc)
    kept = tuple(claims)
    for claim in kept:
        uses.setdefault((claim.job, claim.replica, claim.node), claim.slots)
    return ClusterSnapshot(
        nodes=list(nodes),
        known=list(nodes if known is None else known),
        uses=uses,
        from_records=frozenset(named),
        claims=kept,
        revision=revision,
        records=records,
        unfit=dict(unfit or {}),
    )


@dataclass(frozen=True)
class ClusterReads:
    """The backend reads a snapshot takes, as bound methods. A service passes its own
    backend's (``ClusterReads(b.list_nodes, b.live_nodes, b.list_worker_groups,
    b.unfit_nodes)``), so
    what it reads of a cluster shows in its own code, where the RBAC scan of the
    Kubernetes permissions looks."""

    list_nodes: Callable[[], Awaitable[list[NodeInfo]]]
    live_nodes: Callable[[], Awaitable[list[NodeInfo]]]
    list_worker_groups: Callable[[], Awaitable[list[WorkerGroupSpec]]]
    unfit_nodes: Callable[[TrainingJob, Iterable[NodeInfo]], dict[str, str]]

    @classmethod
    def of(cls, backend: ClusterBackend) -> ClusterReads:
        """The reads of ``backend``."""
        return cls(
            backend.list_nodes, backend.live_nodes, backend.list_worker_groups, backend.unfit_nodes
        )


class RecordSource(Protocol):
    """Where the job records come from (:class:`~resurge.control.state.records.JobStore`)."""

    async def all(self) -> list[JobRecord]: ...  # noqa: D102 - JobStore.all


async def read_snapshot(
    reads: ClusterReads, store: RecordSource, allocations: Allocations | None = None
) -> ClusterSnapshot:
    """Read the ledger first, then the records, worker groups and nodes: a claim is
    dropped only after its record is written, so whatever the ledger no longer holds,
    the records read after it name. No ``allocations``: no claims (a viewer before any
    placer made the ledger)."""
    claims: list[Claim] = []
    revision = 0
    if allocations is not None:
        claims, revision = await allocations.read()
    records = await store.all()
    groups = await reads.list_worker_groups()
    live = await reads.live_nodes()
    known = await reads.list_nodes()
    unfit = {
        record.name: found
        for record in records
        if not record.phase.finished and (found := reads.unfit_nodes(record.spec, known))
    }
    return build_snapshot(
        live, records, groups, claims, known=known, revision=revision, unfit=unfit
    )


def move_view(snapshot: ClusterSnapshot, job: str) -> ClusterView:
    """What a node recovery of ``job`` may move a replica to: the live nodes it may use
    and the slots every other job (and other pods) uses or holds on each."""
    return ClusterView(nodes=snapshot.nodes_for(job), used=snapshot.used(exclude_job=job))
