"""The input of the elastic decision, built from job records and nodes
(:func:`resurge.control.decisions.elastic_decision.decide`).

Pure functions, no I/O: the scaler service reads the records and the live nodes, keeps
three small maps of its own between decisions (when it last resized each job; when it
first saw each node a job runs on gone or unschedulable, :func:`lost_since`; when it
first saw each node schedulable, :func:`ready_since`), and calls :func:`shapes_from`.
Times become seconds since the epoch (``datetime.timestamp``).

Phases: a Pending record that has a checkpoint is Suspended (it resumes from it), one
without is Pending; Running is Running; Recovering, Resizing, or Running with a recovery
pending is Running and busy (it keeps its slots, nothing resizes it); finished records
are left out, so their slots are free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from resurge.cluster import NodeInfo
from resurge.control.decisions.elastic_decision import ZONE_LABEL, Cluster, JobShape, Node, Phase
from resurge.control.state.records import JobRecord
from resurge.events import JobPhase

__all__ = ["cluster_from", "lost_since", "ready_since", "shape_of", "shapes_from"]

_BUSY = (JobPhase.RECOVERING, JobPhase.RESIZING)


def cluster_from(
    nodes: Iterable[NodeInfo],
    topology_keys: tuple[str, ...] = (ZONE_LABEL,),
    ready: Mapping[str, float | None] | None = None,
    reserved: Mapping[str, int] | None = None,
) -> Cluster:
    """The :class:`Cluster` of ``nodes`` (pass the live ones: the rest count as gone);
    ``ready`` maps a node to when it became schedulable (:func:`ready_since`);
    ``reserved``: slots taken by what no record names
    (:meth:`~resurge.control.views.cluster_snapshot.ClusterSnapshot.reserved`)."""
    since = ready or {}
    held = reserved or {}
    return Cluster(
        nodes=tuple(
            Node(
                name=n.name,
                slots=n.slots,
                schedulable=n.schedulable,
                labels=dict(n.labels),
                ready_since=since.get(n.name),
                reserved=held.get(n.name, 0),
            )
            for n in nodes
        ),
        topology_keys=topology_keys,
    )


def ready_since(
    previous: Mapping[str, float | None] | None, nodes: Iterable[NodeInfo], now: float
) -> dict[str, float | None]:
    """When each schedulable node of ``nodes`` became so: ``previous``'s time where it
    has the node, else ``now``; with no ``previous`` (the first look) every node counts
    as schedulable for long (None). Nodes not schedulable now drop out."""
    fine = [n.name for n in nodes if n.schedulable]
    if previous is None:
        return dict.fromkeys(fine)
    return {name: previous.get(name, now) for name in fine}


def lost_since(
    previous: Mapping[str, float],
    records: Iterable[JobRecord],
    nodes: Iterable[NodeInfo],
    now: float,
) -> dict[str, float]:
    """When each node a job runs on was first seen gone or unschedulable: ``previous``'s
    time where it has one, else ``now``; nodes that are fine again drop out."""
    fine = {n.name for n in nodes if n.schedulable}
    used = {p.node for r in records if not r.phase.finished for p in r.placements}
    return {node: previous.get(node, now) for node in sorted(used - fine)}


def _phase(record: JobRecord) -> tuple[Phase, bool]:
    if record.phase is JobPhase.PENDING:
        return (Phase.PENDING if record.latest_checkpoint is None else Phase.SUSPENDED), False
    busy = record.phase in _BUSY or record.pending_recovery is not None
    return Phase.RUNNING, busy


def shape_of(
    record: JobRecord,
    now: float,
    resized_at: float | None,
    lost: Mapping[str, float],
    unfit: Iterable[str] = (),
) -> JobShape:
    """The :class:`JobShape` of one unfinished record; ``unfit``: nodes it may not use
    (avoided as the nodes it faulted on are)."""
    spec = record.spec.spec
    phase, busy = _phase(record)
    nodes = tuple(p.node for p in sorted(record.placements, key=lambda p: p.replica))
    if phase is not Phase.RUNNING:
        nodes = ()
    return JobShape(
        name=record.name,
        nproc=spec.nproc_per_node,
        sizes=tuple(spec.replicas.allowed_sizes()),
        priority=spec.priority,
        submitted=record.submitted.timestamp(),
        phase=phase,
        nodes=nodes,
        resized_at=resized_at,
        restarted_at=record.history[-1].time.timestamp() if record.history else None,
        avoid=frozenset(record.avoid_nodes).union(unfit),
        lost={node: lost.get(node, now) for node in nodes if node in lost},
        spares=tuple(record.spare_nodes) if phase is Phase.RUNNING else (),
        busy=busy,
        held=spec.suspend,
        cooldown=spec.elastic.cooldown_seconds,
        snooze=spec.elastic.scale_up_snooze_seconds,
        faulty_timeout=spec.recovery.faulty_scale_down_timeout_seconds,
    )


def shapes_from(
    records: Iterable[JobRecord],
    nodes: Iterable[NodeInfo],
    now: float,
    *,
    resized_at: Mapping[str, float] | None = None,
    lost: Mapping[str, float] | None = None,
    topology_keys: tuple[str, ...] = (ZONE_LABEL,),
    ready: Mapping[str, float | None] | None = None,
    reserved: Mapping[str, int] | None = None,
    unfit: Mapping[str, Iterable[str]] | None = None,
) -> tuple[Cluster, list[JobShape]]:
    """The cluster and the shapes of the unfinished ``records``, ready for ``decide``.

    ``resized_at`` maps a job to when it was last resized; ``lost`` maps a node to when
    it was first seen gone (:func:`lost_since`); ``ready`` maps a node to when it was
    first seen schedulable (:func:`ready_since`); ``reserved``: the snapshot's slots in
    use that no record names
    (:meth:`~resurge.control.views.cluster_snapshot.ClusterSnapshot.reserved`);
    ``unfit``: the nodes each job may not use
    (:attr:`~resurge.control.views.cluster_snapshot.ClusterSnapshot.unfit`).
    """
    resized = resized_at or {}
    unfit = unfit or {}
    shapes = [
        shape_of(record, now, resized.get(record.name), lost or {}, unfit.get(record.name, ()))
        for record in records
        if not record.phase.finished
    ]
    return cluster_from(nodes, topology_keys, ready, reserved), shapes
