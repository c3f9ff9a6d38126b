"""The stream families of DESIGN section 2 and the classes of event kinds, in one table.

Each family is one subject prefix (``<root>.<family>.>``) stored in one JetStream
stream; :data:`FAMILIES` says which event kinds travel on it and whether its stream
keeps only a short retention (the raw telemetry). The raw kinds come in classes:
:data:`RAW_JOB_KINDS` (about one job's workers and agents), :data:`RAW_NODE_KINDS`
(about a node: job token ``_``), and among them :data:`FAULT_GRADE_KINDS`, the few
urgent kinds the detector reads through a fault lane of their own and takes the live
copies of. The bus creates the streams from this table, the permissions name them from
it, and the events reference lists each family's kinds from it (a kind the event models
define and no family carries fails the reference's generation).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FAMILIES",
    "FAMILY_NAMES",
    "FAULT_GRADE_KINDS",
    "RAW_JOB_KINDS",
    "RAW_NODE_KINDS",
    "StreamFamily",
    "family",
]

RAW_JOB_KINDS = (
    "process_started",
    "process_exited",
    "process_state",
    "rendezvous_passed",
    "log_line",
    "agent_state",
    "progress",
    "checkpoint_saved",
    "worker_fault",
)
RAW_NODE_KINDS = ("gpu_sample", "gpu_error", "node_report")
FAULT_GRADE_KINDS = frozenset({"process_exited", "worker_fault", "agent_state", "gpu_error"})


@dataclass(frozen=True)
class StreamFamily:
    """One subject family: its name (the subject's third token), the kinds it carries,
    and whether its stream keeps the short raw retention."""

    name: str
    kinds: tuple[str, ...]
    short_retention: bool = False


FAMILIES: tuple[StreamFamily, ...] = (
    StreamFamily("raw", RAW_JOB_KINDS + RAW_NODE_KINDS, short_retention=True),
    StreamFamily("fault", ("fault_detected",)),
    StreamFamily("capacity", ("capacity_changed",)),
    StreamFamily(
        "cmd",
        ("assign", "stop", "checkpoint_now", "inject_fault", "inject_gpu_error", "repair_node"),
    ),
    StreamFamily(
        "action", ("recovery_started", "recovery_finished", "scale_decided", "phase_changed")
    ),
    StreamFamily("job", ("job_submitted", "job_deleted", "replica_finished")),
    StreamFamily("dlq", ("dead_letter",)),
)
FAMILY_NAMES = tuple(f.name for f in FAMILIES)


def family(name: str) -> StreamFamily:
    """The family called ``name``; ValueError naming the families if there is none."""
    for one in FAMILIES:
        if one.name == name:
            return one
    raise ValueError(f"no stream family {name!r} (families: {', '.join(FAMILY_NAMES)})")
