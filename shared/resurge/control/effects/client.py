"""What the ``resurge`` command does over the bus: submit, delete, status, watch events,
inject faults."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from resurge.cluster import ClusterBackend, NodeInfo, UnknownNodeError, open_backend
from resurge.contract.xid import action_for, lookup
from resurge.control.state.records import JobRecord, JobStore, status_view
from resurge.events import (
    InjectFault,
    InjectGpuError,
    JobDeleted,
    JobSubmitted,
)
from resurge.jobspec import TrainingJob
from resurge.jobspec.mutability import MUTABLE
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

__all__ = [
    "SubmitRefused",
    "connected",
    "delete_job",
    "inject_fault",
    "inject_gpu_warning",
    "inject_xid",
    "job_status",
    "submit_job",
]


@asynccontextmanager
async def connected(settings: Settings) -> AsyncIterator[Bus]:
    """A bus connection with the streams in place, closed on leaving (the CLI creates
    missing streams but never changes them: that is the services' part)."""
    bus = await Bus.connect(settings, "cli")
    try:
        await bus.ensure_streams(update=False)
        yield bus
    finally:
        await bus.close()


class SubmitRefused(ValueError):
    """A job of that name exists and the submission would not do what it seems to."""


async def submit_job(bus: Bus, job: TrainingJob) -> str:
    """Submit ``job`` as ``kubectl apply`` would; what happened: ``created``,
    ``unchanged`` (the same spec is running: nothing sent) or ``configured`` (a running
    job takes what may change while it runs: :data:`~resurge.jobspec.mutability.MUTABLE`,
    its monitoring settings and ``replicas.max``).

    :class:`SubmitRefused` names the reason when a job of that name has finished (it
    would run again from the start over its own checkpoints: delete it first) or runs
    and the new spec changes a field a running job cannot take."""
    found = await JobStore(await bus.jobs_bucket()).get(job.name)
    outcome = "created"
    if found is not None:
        record = found[0]
        if record.phase.finished:
            raise SubmitRefused(
                f"trainingjob {job.name} already exists and has {record.phase.value}; "
                f"`resurge delete {job.name}` first to run it again from the start"
            )
        if record.spec.spec == job.spec:
            return "unchanged"
        fixed = [f for f in _changed_fields(record.spec, job) if f not in MUTABLE]
        if fixed:
            raise SubmitRefused(
                f"trainingjob {job.name} is {record.phase.value}: only "
                f"{' and '.join(sorted(MUTABLE))} can change while it runs, and this changes "
                f"{', '.join(fixed)}; `resurge delete {job.name}` first to start it again "
                "with the new spec"
            )
        outcome = "configured"
    await bus.publish(
        bus.subjects.job(job.name), JobSubmitted(source=bus.source, job=job.name, spec=job)
    )
    return outcome


def _changed_fields(old: TrainingJob, new: TrainingJob) -> list[str]:
    """The spec fields that differ, as dotted camelCase paths: ``spec.<name>``, and inside
    a field only partly mutable (``spec.replicas``), its children that differ."""
    before, after = old.spec.model_dump(by_alias=True), new.spec.model_dump(by_alias=True)
    return sorted(_differing("spec", before, after))


def _differing(where: str, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    partly = {path.rsplit(".", 1)[0] for path in MUTABLE}
    found: list[str] = []
    for key in set(before) | set(after):
        path, old, new = f"{where}.{key}", before.get(key), after.get(key)
        if old == new:
            continue
        if path in partly and isinstance(old, dict) and isinstance(new, dict):
            found += _differing(path, old, new)
        else:
            found.append(path)
    return found


async def delete_job(bus: Bus, name: str) -> JobRecord:
    """Publish JobDeleted for the job ``name`` and return its record as it was;
    :class:`LookupError` if there is none."""
    found = await JobStore(await bus.jobs_bucket()).get(name)
    if found is None:
        raise LookupError(f"no job named {name!r}")
    await bus.publish(bus.subjects.job(name), JobDeleted(source=bus.source, job=name))
    return found[0]


async def job_status(bus: Bus, name: str | None) -> list[dict[str, object]]:
    """The status view of job ``name`` (none if unknown), or of every job by name."""
    store = JobStore(await bus.jobs_bucket())
    if name is not None:
        found = await store.get(name)
        return [] if found is None else [status_view(found[0])]
    return [status_view(record) for record in sorted(await store.all(), key=lambda r: r.name)]


async def inject_fault(bus: Bus, job: str, rank: int, fault: str, line: str = "") -> str:
    """Send InjectFault to the agent running global rank ``rank``; says where it went."""
    found = await JobStore(await bus.jobs_bucket()).get(job)
    if found is None:
        raise LookupError(f"no job named {job!r}")
    record = found[0]
    nproc = record.spec.spec.nproc_per_node
    world = nproc * len(record.placements)
    out_of_range = LookupError(f"rank {rank} is not in {job} (world size {world})")
    if world and not 0 <= rank < world:
        raise out_of_range
    if record.phase.finished:
        raise LookupError(
            f"job {job!r} has {record.phase.value}: no worker is running to inject into"
        )
    if not 0 <= rank < world:
        raise out_of_range
    # Ranks go by the placements in replica order (planner.assignments): after a shrink
    # that dropped a lower replica, rank // nproc is not the replica's number.
    position, local_rank = divmod(rank, nproc)
    replica = sorted(record.placements, key=lambda p: p.replica)[position].replica
    event = InjectFault(
        source=bus.source,
        job=job,
        uid=record.uid,
        replica=replica,
        rank=rank,
        generation=record.generation,
        fault=fault,
        local_rank=local_rank,
        line=line,
    )
    await bus.publish(bus.subjects.cmd(job, replica), event)
    return f"replica {replica}, local rank {local_rank}, generation {record.generation}"


async def inject_xid(bus: Bus, node: str, gpu: int, xid: int) -> str:
    """Send InjectGpuError to ``node``'s monitor; says what the XID means.

    A node the cluster backend does not list, or a GPU index beyond the node's slots,
    is refused with :class:`LookupError`.
    """
    info = await _node_record(await open_backend(bus, bus.settings), node)
    if not 0 <= gpu < info.slots:
        raise LookupError(f"node {node!r} has {info.slots} GPUs; there is no GPU {gpu}")
    event = InjectGpuError(source=bus.source, node=node, gpu=gpu, xid=xid)
    await bus.publish(bus.subjects.node_cmd(node), event)
    return f"{lookup(xid).description}; built-in action {action_for(xid).value}"


async def inject_gpu_warning(bus: Bus, node: str, gpu: int, sign: str) -> str:
    """Send InjectGpuError with a warning ``sign`` (``corrected-ecc``, ``retired-pages``
    or ``thermal``) to ``node``'s monitor; says what its readings will show.

    A node the cluster backend does not list, or a GPU index beyond the node's slots,
    is refused with :class:`LookupError`.
    """
    if sign not in _WARNING_WORDS:
        raise LookupError(f"no warning sign {sign!r} (signs: {', '.join(_WARNING_WORDS)})")
    info = await _node_record(await open_backend(bus, bus.settings), node)
    if not 0 <= gpu < info.slots:
        raise LookupError(f"node {node!r} has {info.slots} GPUs; there is no GPU {gpu}")
    event = InjectGpuError.model_validate(
        {"source": bus.source, "node": node, "gpu": gpu, "warning": sign}
    )
    await bus.publish(bus.subjects.node_cmd(node), event)
    return _WARNING_WORDS[sign]


_WARNING_WORDS = {
    "corrected-ecc": "its corrected ECC count rises every sample",
    "retired-pages": "it retires one more memory page every sample",
    "thermal": "its clocks are thermally throttled from now on",
}


async def _node_record(backend: ClusterBackend, node: str) -> NodeInfo:
    """The node as the backend lists it; :class:`UnknownNodeError` (a
    :class:`LookupError`) naming the known nodes if it lists none by that name."""
    nodes = {info.name: info for info in await backend.list_nodes()}
    if node not in nodes:
        known = ", ".join(sorted(nodes)) or "none"
        raise UnknownNodeError(f"no node named {node!r} (nodes: {known})")
    return nodes[node]
