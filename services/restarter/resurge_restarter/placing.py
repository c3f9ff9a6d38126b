"""Where a node recovery moves replicas: the one cluster snapshot, and the allocation
ledger so that no other placer takes the same slots meanwhile.

:meth:`MovePlacer.reserve` reads the snapshot
(:func:`resurge.control.views.cluster_snapshot.read_snapshot`: every job's replicas, held
spares, worker groups and claims), decides on a copy of the job's record with the
caller's ``decide`` and, if the decision moves replicas, claims their new slots in
the ledger with one compare-and-set (:mod:`resurge.control.state.allocations`); a lost
compare-and-set reads and decides again. The caller then writes its record deciding
with the same view, checks with :func:`covered` that the moves it wrote are the ones
claimed, carries the plan out (creating the moved replicas' worker groups), and only
then drops the claims (:meth:`MovePlacer.release_held`): the record and the groups name
those slots now, even if the job is deleted meanwhile.

Only faults that may move a replica (a node's fault, or a job with node faults in its
history) come here; an in-process, process or pod restart keeps every replica where it
is and never reads the snapshot or the ledger.
"""

from __future__ import annotations

from collections.abc import Callable

from resurge.cluster import ClusterBackend
from resurge.control.decisions.recovery_policy import ClusterView
from resurge.control.state.allocations import (
    AllocationConflict,
    Allocations,
    Claim,
    open_allocations,
)
from resurge.control.state.records import JobRecord, JobStore
from resurge.control.views.cluster_snapshot import ClusterReads, move_view, read_snapshot
from resurge.runtime.bus import Bus, TransientError

__all__ = ["CLAIM_SECONDS", "MovePlacer", "covered"]

CLAIM_SECONDS = 30.0
"""How long a move's claim holds if its restarter dies before writing the record."""

_ATTEMPTS = 20


def _moves(record: JobRecord, fault_id: str) -> list[tuple[int, str]]:
    plan = record.pending_recovery
    if plan is None or plan.fault_id != fault_id:
        return []
    return [(m.replica, m.to_node) for m in plan.moves]


def covered(record: JobRecord, fault_id: str, claims: list[Claim]) -> bool:
    """Whether every move ``record``'s plan for ``fault_id`` makes was claimed."""
    held = {(c.replica, c.node) for c in claims}
    return all(move in held for move in _moves(record, fault_id))


class MovePlacer:
    """Reads the snapshot and claims moves for one restarter instance (``me``)."""

    def __init__(self, bus: Bus, backend: ClusterBackend, store: JobStore, me: str) -> None:
        self.bus = bus
        self.reads = ClusterReads(
            backend.list_nodes,
            backend.live_nodes,
            backend.list_worker_groups,
            backend.unfit_nodes,
        )
        self.store = store
        self.me = me
        self._allocations: Allocations | None = None
        self.held: dict[str, list[Claim]] = {}

    async def allocations(self) -> Allocations:
        """The ledger (its bucket made on first use)."""
        if self._allocations is None:
            self._allocations = await open_allocations(self.bus, self.me)
            assert self._allocations is not None
        return self._allocations

    async def reserve(
        self, record: JobRecord, fault_id: str, decide: Callable[[JobRecord, ClusterView], object]
    ) -> tuple[ClusterView, list[Claim]]:
        """The view to decide ``record``'s fault on, and the claims of the moves that
        decision makes (none: nothing to hold), held until :meth:`release_held`.
        Raises :class:`TransientError` when the ledger kept moving (the fault is
        redelivered and decided again)."""
        allocations = await self.allocations()
        nproc = record.spec.spec.nproc_per_node
        for _ in range(_ATTEMPTS):
            snapshot = await read_snapshot(self.reads, self.store, allocations)
            view = move_view(snapshot, record.name)
            preview = record.model_copy(deep=True)
            decide(preview, view)
            claims = [
                allocations.make(record.name, replica, node, nproc, CLAIM_SECONDS)
                for replica, node in _moves(preview, fault_id)
            ]
            if not claims:
                return view, []
            try:
                await allocations.claim(snapshot.claims, snapshot.revision, claims)
            except AllocationConflict:
                continue
            self.held[fault_id] = claims
            return view, claims
        raise TransientError(f"{record.name}: the allocation ledger kept moving; deciding again")

    async def release_held(self, fault_id: str) -> None:
        """Drop the claims :meth:`reserve` made for ``fault_id`` (none: nothing to do)."""
        claims = self.held.pop(fault_id, [])
        if claims:
            await (await self.allocations()).release(claims)
