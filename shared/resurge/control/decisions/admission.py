"""Admission, placement and completion for fixed-size jobs: pure functions, no I/O.

The scaler service admits with them; the goodput simulator starts a requeued job with
:func:`start`.

A submitted job becomes a Pending record. Pending jobs are admitted in priority order
(then submission order) when ``replicas.min`` worker groups of ``nprocPerNode`` slots
fit on schedulable nodes the job does not avoid (nodes that faulted under it), and
``recovery.spares`` further nodes without a replica of the job have ``nprocPerNode``
free slots to hold for it; each replica goes to the node with the most free slots
that fits it, so replicas spread. An elastic job starts with as many replicas past
``min`` as fit, up to the largest allowed size (so it does not resize at once). A
running job's spares count as taken. A job whose name was used by a finished job
starts one generation past it, so stale events of the old run stay stale.

A job that no node of the cluster could hold even with every job gone
(:func:`cannot_hold`: no node has ``nprocPerNode`` slots, or all of them together hold
fewer than ``min`` replicas) is still accepted, since nodes can be added; its wait
reason and the CLI's warning at submit say so, naming what it needs and what the
cluster has. Nodes the job may not use (``unfit``: on Kubernetes, its template's
selector, affinity or tolerations keep its pods off them) count for nothing, and its
wait reason names each with why.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from resurge.cluster import NodeInfo
from resurge.control.decisions.lifecycle import move_to
from resurge.control.decisions.planner import master_port_for
from resurge.control.state.records import JobRecord, Placement
from resurge.events import JobPhase
from resurge.jobspec import TrainingJob

__all__ = [
    "UNHOLDABLE",
    "admission_order",
    "cannot_hold",
    "mark_replica_finished",
    "needed_replicas",
    "new_record",
    "place",
    "start",
    "update_live",
    "wait_reason",
    "why_waiting",
]


def new_record(job: TrainingJob, previous: JobRecord | None, name: str | None = None) -> JobRecord:
    """A Pending record of ``job`` named ``name`` (else ``job.name``; on Kubernetes a
    TrainingJob's bus name), one generation past ``previous`` (a finished job of that
    name), if any."""
    generation = 0 if previous is None else previous.generation + 1
    return JobRecord(
        name=job.name if name is None else name,
        spec=job,
        phase=JobPhase.PENDING,
        generation=generation,
        message="waiting for capacity",
    )


def admission_order(records: list[JobRecord]) -> list[JobRecord]:
    """The Pending records, highest priority first, then oldest submission, then name;
    none that is held (``spec.suspend``: by its owner, or while Kueue has not admitted
    it)."""
    pending = [r for r in records if r.phase is JobPhase.PENDING and not r.spec.spec.suspend]
    return sorted(
        pending, key=lambda r: (-getattr(r.spec.spec, "priority", 0), r.submitted, r.name)
    )


def needed_replicas(record: JobRecord, now: datetime) -> int:
    """The fewest replicas ``record`` may start with now: ``replicas.min``, except for an
    elastic job requeued because a node was lost with no node to move to: until
    ``faultyScaleDownTimeoutSeconds`` past the loss it waits for room for as many
    replicas as it had, and only then starts smaller."""
    spec = record.spec.spec
    plan = record.pending_recovery
    if plan is None or not plan.requeue or plan.resize or not spec.replicas.elastic:
        return spec.replicas.min
    hold = timedelta(seconds=spec.recovery.faulty_scale_down_timeout_seconds)
    if now >= plan.detected_at + hold:
        return spec.replicas.min
    return max(spec.replicas.min, min(len(plan.stop_placements), spec.replicas.upper))


def place(
    job: TrainingJob,
    nodes: list[NodeInfo],
    used: dict[str, int],
    avoid: list[str] | tuple[str, ...] = (),
    at_least: int | None = None,
) -> tuple[list[Placement], list[str]] | None:
    """Placements for ``replicas.min`` (or ``at_least``) replicas and the spare nodes to
    hold, or None if they do not fit now.

    ``used`` maps node name to slots already taken; it is updated for the placements
    and spares, so several jobs can be placed against one snapshot.
    """
    nproc = job.spec.nproc_per_node
    free = {
        n.name: n.slots - used.get(n.name, 0)
        for n in nodes
        if n.schedulable and n.name not in avoid
    }
    address = {n.name: n.address for n in nodes}
    placements = []
    for replica in range(job.spec.replicas.min if at_least is None else at_least):
        fits = [name for name, slots in free.items() if slots >= nproc]
        if not fits:
            return None
        node = max(fits, key=lambda name: (free[name], name))
        free[node] -= nproc
        placements.append(Placement(replica=replica, node=node, address=address[node]))
    taken = {p.node for p in placements}
    candidates = sorted(
        (name for name, slots in free.items() if slots >= nproc and name not in taken),
        key=lambda name: (-free[name], name),
    )
    spares = candidates[: job.spec.recovery.spares]
    if len(spares) < job.spec.recovery.spares:
        return None
    for name in spares:
        free[name] -= nproc
    placements += _extra(job, free, address, len(placements))
    for p in placements:
        used[p.node] = used.get(p.node, 0) + nproc
    for name in spares:
        used[name] = used.get(name, 0) + nproc
    return placements, spares


def _extra(
    job: TrainingJob, free: dict[str, int], address: dict[str, str], placed: int
) -> list[Placement]:
    """For an elastic job: replicas past ``min`` on what is still free, up to the largest
    allowed size that fits (none for a fixed-size job)."""
    nodes: list[str] = []
    nproc = job.spec.nproc_per_node
    while placed + len(nodes) < job.spec.replicas.upper:
        fits = [name for name, slots in free.items() if slots >= nproc]
        if not fits:
            break
        node = max(fits, key=lambda name: (free[name], name))
        free[node] -= nproc
        nodes.append(node)
    size = job.spec.replicas.largest_size_within(placed + len(nodes)) or placed
    return [
        Placement(replica=placed + i, node=node, address=address[node])
        for i, node in enumerate(nodes[: size - placed])
    ]


# At most this many nodes are named in a wait reason's list of nodes a job may not use.
_SHOWN = 5

UNHOLDABLE = "no node of this cluster can hold it"
"""How a wait reason from :func:`cannot_hold` begins."""


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def cannot_hold(job: TrainingJob, nodes: list[NodeInfo], *, local: bool = False) -> str | None:
    """Why no node of ``nodes`` could hold ``job`` even with every other job gone (each
    node's slots in all count, cordoned or not: those can be freed), or None when they
    could, or when no node reports at all. ``local``: the hint names ``resurge node add``."""
    if not nodes:
        return None
    nproc = job.spec.nproc_per_node
    need = job.spec.replicas.min
    holds = sum(node.slots // nproc for node in nodes)
    if holds >= need:
        return None
    largest = max(node.slots for node in nodes)
    wide = sum(1 for node in nodes if node.slots >= nproc)
    add = f"`resurge node add --gpus {nproc}`" if local else _gpus(nproc)
    if not wide:
        return (
            f"{UNHOLDABLE}: no node has {nproc} free-able slots for nprocPerNode {nproc} "
            f"(largest node: {_gpus(largest)}); add a node with {add}"
        )
    return (
        f"{UNHOLDABLE}: it needs {need} replica(s) of nprocPerNode {nproc} slots, and its "
        f"{len(nodes)} node(s) hold at most {holds} (largest node: {_gpus(largest)}); "
        f"add {need - holds} node(s) with {add}"
    )


def why_waiting(
    job: TrainingJob,
    nodes: list[NodeInfo],
    used: dict[str, int],
    avoid: list[str] | tuple[str, ...] = (),
    at_least: int | None = None,
    *,
    local: bool = False,
    silent: list[str] | tuple[str, ...] = (),
    unfit: Mapping[str, str] | None = None,
) -> str:
    """Why ``job`` does not fit now, in words (for a Pending job's status): that no node
    could ever hold it (:func:`cannot_hold`), or else node by node, ``silent`` (known
    nodes not reporting) included, each with the command that brings it back;
    ``unfit``: the nodes the job may not use, with why."""
    unfit = unfit or {}
    fit = [n for n in nodes if n.name not in unfit]
    if nodes and not fit:
        shown = "; ".join(f"{name}: {why}" for name, why in sorted(unfit.items())[:_SHOWN])
        more = f"; and {len(unfit) - _SHOWN} more" if len(unfit) > _SHOWN else ""
        return (
            f"{UNHOLDABLE}: no node lets its pods on (its template's nodeSelector, node "
            f"affinity and tolerations): {shown}{more}"
        )
    # A known node not reporting may come back: only with every node reporting is "no
    # node can hold it" known.
    never = None if silent else cannot_hold(job, fit, local=local)
    if never is not None:
        return never
    nproc = job.spec.nproc_per_node
    count = job.spec.replicas.min if at_least is None else at_least
    needs = f"needs {count} node(s) with {nproc} free slot(s)"
    if count > job.spec.replicas.min:
        needs += (
            f" (as many as before a node was lost, for up to "
            f"{job.spec.recovery.faulty_scale_down_timeout_seconds:g} s; then "
            f"{job.spec.replicas.min})"
        )
    if job.spec.recovery.spares:
        needs += f" and {job.spec.recovery.spares} spare(s)"
    notes = _node_notes(fit, used, nproc, avoid)
    if unfit:
        shown = ", ".join(sorted(unfit)[:_SHOWN]) + (" ..." if len(unfit) > _SHOWN else "")
        notes.append(f"{len(unfit)} node(s) its template keeps its pods off ({shown})")
    for name in sorted(silent):
        back = f" (`resurge node up {name}` if it was powered off)" if local else ""
        notes.append(f"{name} not reporting{back}")
    if not nodes:
        notes.append("no node is reporting")
    return f"waiting for capacity: {needs}; " + "; ".join(notes)


def _node_notes(
    nodes: list[NodeInfo], used: dict[str, int], nproc: int, avoid: list[str] | tuple[str, ...]
) -> list[str]:
    """Why each reporting node takes no replica now, with the command that changes it."""
    notes = []
    for node in sorted(nodes, key=lambda n: n.name):
        free = node.slots - used.get(node.name, 0)
        if node.name in avoid:
            notes.append(
                f"{node.name} avoided by this job: it faulted there "
                f"(`resurge node uncordon {node.name}` once it is fit)"
            )
        elif node.cordoned:
            why = f": {node.cordon_reason}" if node.cordon_reason else ""
            notes.append(f"{node.name} cordoned{why} (`resurge node uncordon {node.name}`)")
        elif not node.healthy:
            notes.append(
                f"{node.name} unhealthy (`resurge node uncordon {node.name}` once it is repaired)"
            )
        elif free < nproc:
            notes.append(f"{node.name} has {max(free, 0)} of {node.slots} slot(s) free")
    return notes


def wait_reason(record: JobRecord, reason: str) -> bool:
    """Say why a Pending job waits, keeping what an earlier step said (a requeue's why)."""
    if record.phase is not JobPhase.PENDING:
        return False
    head = record.message.split(" | ")[0] if " | " in record.message else record.message
    if head.startswith(("waiting for capacity", UNHOLDABLE)):  # an earlier reason of ours
        head = ""
    message = f"{head} | {reason}" if head else reason
    if message == record.message:
        return False
    record.message = message
    return True


def start(record: JobRecord, placements: list[Placement], spares: list[str] | None = None) -> bool:
    """Move a Pending record to Running on ``placements``, holding ``spares``."""
    if record.phase is not JobPhase.PENDING:
        return False
    record.placements = placements
    record.spare_nodes = list(spares or [])
    record.master_port = master_port_for(record.name, record.generation, record.uid)
    record.finished_replicas = []
    record.alive_since = None
    record.resume_step = None if record.latest_checkpoint is None else record.latest_checkpoint.step
    why = f"running {len(placements)} replica(s) on " + ", ".join(
        sorted({p.node for p in placements})
    )
    if record.spare_nodes:
        why += f"; spare: {', '.join(record.spare_nodes)}"
    move_to(record, JobPhase.RUNNING, why)
    return True


def mark_replica_finished(record: JobRecord, replica: int, generation: int) -> bool:
    """Record that ``replica`` finished; the job succeeds when every replica has."""
    if record.phase.finished or generation != record.generation:
        return False
    if replica in record.finished_replicas:
        return False
    record.finished_replicas = sorted({*record.finished_replicas, replica})
    if len(record.finished_replicas) == len(record.placements):
        move_to(record, JobPhase.SUCCEEDED, f"every replica finished in generation {generation}")
        record.pending_recovery = None
    return True


def update_live(record: JobRecord, job: TrainingJob) -> bool:
    """A running job submitted again: take what may change while it runs
    (:data:`~resurge.jobspec.mutability.MUTABLE`): its ``monitoring`` settings, which
    detectors read live, ``replicas.max``, which the scaler's next decision reads (a
    lower max shrinks the job to it, a higher one lets it grow), and ``suspend`` (the
    next decision suspends a held job, or lets it resume); keep everything else.
    Whether anything changed."""
    old = record.spec.spec
    replicas = old.replicas.model_copy(update={"max": job.spec.replicas.max})
    spec = old.model_copy(
        update={
            "monitoring": job.spec.monitoring,
            "replicas": replicas,
            "suspend": job.spec.suspend,
        }
    )
    if spec == old:
        return False
    record.spec = record.spec.model_copy(update={"spec": spec})
    return True
