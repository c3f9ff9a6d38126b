"""The worker groups (one per replica: a pod, or a local launch agent) a job record asks for.

Scaler and restarter both create worker groups through the cluster backend; this is
the one place that turns a record's placements into :class:`WorkerGroupSpec`. A
replica's ``incarnation`` comes from the record, so bumping it in the record and
writing the spec again recreates that replica's group (a `pod` or `job` recovery). The
record's ``uid`` names the run, so a job submitted again under its name gets agents
that take only the new run's commands.

A replica is reached (its rendezvous address, for the first one) at its node's address,
or, where the record has a ``worker_domain`` (Kubernetes pod networking), at its worker
group's DNS name: ``<hostname>.<domain>``, the hostname derived from the group
(:func:`resurge.cluster.names.worker_hostname`), so a recreated or moved group has a new
one. Each group carries the domain (``WorkerGroupSpec.domain``), so its pod's network and
the address the others are given come from the one record field.
"""

from __future__ import annotations

from resurge.cluster import WorkerGroupSpec
from resurge.cluster.names import worker_hostname
from resurge.control.state.records import JobRecord, Placement

__all__ = ["worker_address", "worker_group", "worker_groups"]


def worker_group(record: JobRecord, placement: Placement) -> WorkerGroupSpec:
    """The worker group of the replica at ``placement``, at its current incarnation."""
    spec = record.spec.spec
    return WorkerGroupSpec(
        job=record.name,
        replica=placement.replica,
        node=placement.node,
        nproc=spec.nproc_per_node,
        command=spec.command,
        env={var.name: var.value for var in spec.env},
        working_dir=spec.working_dir,
        stop_grace_seconds=spec.recovery.stop_grace_seconds,
        fork_server=spec.fork_server,
        preload=spec.preload_modules,
        incarnation=record.incarnations.get(placement.replica, 0),
        uid=record.uid,
        checkpoint_dir=spec.checkpoint.dir,
        checkpoint_interval_steps=spec.checkpoint.interval_steps,
        checkpoint_interval_seconds=spec.checkpoint.interval_seconds,
        memory_interval_steps=spec.checkpoint.memory_interval_steps,
        memory_budget_bytes=spec.checkpoint.memory_budget,
        domain=record.worker_domain,
    )


def worker_groups(record: JobRecord) -> list[WorkerGroupSpec]:
    """The worker group of every replica the record places."""
    return [worker_group(record, p) for p in record.placements]


def worker_address(record: JobRecord, placement: Placement) -> str:
    """Where the replica at ``placement`` is reached (the module docstring)."""
    group = worker_group(record, placement)
    if group.domain is None:
        return placement.address
    return f"{worker_hostname(group)}.{group.domain}"
