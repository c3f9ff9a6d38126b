"""Rank planning: turn a job record into one Assign command per replica.

Ranks are laid out replica by replica (replica r's local rank l is global rank
``r * nproc + l``), as torchrun does with static rendezvous. Each generation gets a
fresh rendezvous port, so a new process group never meets a stale store.
"""

from __future__ import annotations

import hashlib

from resurge.control.decisions.worker_groups import worker_address
from resurge.control.state.records import JobRecord
from resurge.events import Assign, RecoveryLevel, ReplicaSlot, Source, StopFirst

__all__ = ["WHOLE_TABLE_REPLICAS", "assignments", "command_id", "master_port_for"]

# Up to this many replicas, every Assign carries the whole rank table; above it, each
# carries its own replica's slot (and the count): a fan-out then sends replicas slots,
# not replicas squared.
WHOLE_TABLE_REPLICAS = 64

# Below Linux's default ephemeral range (32768-60999) so a port picked here is not
# already taken by some outgoing connection.
_PORT_BASE = 20000
_PORT_SPAN = 12000


def master_port_for(job: str, generation: int, uid: str = "") -> int:
    """A rendezvous port for (job, generation) of the job record ``uid``: stable, and
    different between generations; two jobs of one name (in two local clusters on one
    machine, or one submitted again) start from different ports."""
    digest = hashlib.blake2b(f"{job}\0{uid}".encode(), digest_size=4).digest()
    return _PORT_BASE + (int.from_bytes(digest) + generation * 7919) % _PORT_SPAN


def command_id(kind: str, job: str, replica: int, generation: int, uid: str = "") -> str:
    """The id of the one ``kind`` command for (job, replica, generation) of the job record
    ``uid``: sent twice (a restarter finishing another's plan), JetStream de-duplicates
    it; a job deleted and submitted again under its name gets a new record, so its
    commands are not taken for the old one's."""
    digest = hashlib.blake2b(f"{job}\0{replica}\0{generation}\0{uid}".encode(), digest_size=10)
    return f"{kind}-{digest.hexdigest()}"


def assignments(
    record: JobRecord,
    source: Source,
    level: RecoveryLevel | None = None,
    stop: StopFirst | None = None,
) -> list[Assign]:
    """One Assign per replica for the record's current generation: the rank table (whole
    up to :data:`WHOLE_TABLE_REPLICAS` replicas, else the replica's own slot), the
    rendezvous on the first replica's address (:func:`.worker_groups.worker_address`),
    the newest checkpoint every rank saved, and ids that make a repeated send a no-op;
    ``stop``: what each stops first."""
    nproc = record.spec.spec.nproc_per_node
    placements = sorted(record.placements, key=lambda p: p.replica)
    table = [
        ReplicaSlot(replica=p.replica, node=p.node, first_rank=i * nproc, nproc=nproc)
        for i, p in enumerate(placements)
    ]
    master = worker_address(record, placements[0])
    checkpoint = record.latest_checkpoint
    whole = len(table) <= WHOLE_TABLE_REPLICAS
    return [
        Assign(
            id=command_id("assign", record.name, slot.replica, record.generation, record.uid),
            source=source,
            job=record.name,
            uid=record.uid,
            replica=slot.replica,
            node=slot.node,
            generation=record.generation,
            world_size=nproc * len(table),
            rank_table=table if whole else [slot],
            replicas=len(table),
            master_addr=master,
            master_port=record.master_port,
            restart_count=record.total_restarts,
            resume_checkpoint=checkpoint.path if checkpoint else None,
            resume_step=checkpoint.step if checkpoint else None,
            level=level,
            rejoin_timeout_seconds=record.spec.spec.recovery.in_process_timeout_seconds,
            stop=stop,
        )
        for slot in table
    ]
