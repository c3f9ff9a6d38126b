"""The stream families of DESIGN section 2 and the classes of event kinds, in one table.

Each family is one subject prefix (``<root>.<family>.>``) stored in one JetStream
stream; :data:`FAMILIES` says which event kinds travel on it and whether its stream
keeps only a short retention (the raw telemetry). The raw kinds come in classes:
:data:`RAW_JOB_KINDS` (about one job's workers and agents), :data:`RAW_NODE_KINDS`
(about a node: job token ``_``), and among them :data:`FAULT_GRADE_KINDS`, the few
urgent kinds that a worker's or a node's failure is told by.

Each family is stored in one JetStream stream, but for the raw family: its fault-grade
kinds are stored in a stream of their own (:data:`STREAMS`: ``raw-faults``, subjects
``<root>.raw.*.<kind>.*`` of those kinds), and the rest of the raw kinds, the
telemetry, in the ``raw`` stream, so a backlog of telemetry never queues in front of a
fault (two streams may not share a subject, so the telemetry stream names its kinds
too). The subjects are unchanged: which stream stores a raw event follows from its
kind token. The bus creates the streams from this table, the permissions name them
from it, and the events reference lists each family's kinds from it (a kind the event
models define and no family carries fails the reference's generation).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FAMILIES",
    "FAMILY_NAMES",
    "FAULT_GRADE_KINDS",
    "RAW_JOB_KINDS",
    "RAW_NODE_KINDS",
    "RAW_TELEMETRY_KINDS",
    "STREAMS",
    "STREAM_NAMES",
    "Stream",
    "StreamFamily",
    "family",
    "stream",
    "stream_of",
    "streams_of",
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
    "restored",
    "worker_fault",
)
RAW_NODE_KINDS = ("gpu_sample", "gpu_error", "node_report", "gpu_reset", "node_checked")
FAULT_GRADE_KINDS = frozenset({"process_exited", "worker_fault", "agent_state", "gpu_error"})
RAW_TELEMETRY_KINDS = tuple(k for k in RAW_JOB_KINDS + RAW_NODE_KINDS if k not in FAULT_GRADE_KINDS)


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
        (
            "assign",
            "stop",
            "checkpoint_now",
            "inject_fault",
            "inject_gpu_error",
            "repair_node",
            "reset_gpu",
            "check_node",
        ),
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


@dataclass(frozen=True)
class Stream:
    """One JetStream stream: its name token (``Subjects.stream(name)``), the family whose
    subjects it stores and, for a part of a family, the kinds it stores (empty: every
    subject of the family)."""

    name: str
    family: str
    kinds: tuple[str, ...] = ()
    short_retention: bool = False


STREAMS: tuple[Stream, ...] = tuple(
    one
    for f in FAMILIES
    for one in (
        (
            Stream("raw", "raw", RAW_TELEMETRY_KINDS, short_retention=True),
            Stream("raw-faults", "raw", tuple(sorted(FAULT_GRADE_KINDS)), short_retention=True),
        )
        if f.name == "raw"
        else (Stream(f.name, f.name, short_retention=f.short_retention),)
    )
)
STREAM_NAMES = tuple(s.name for s in STREAMS)


def stream(name: str) -> Stream:
    """The stream called ``name``; ValueError naming the streams if there is none."""
    for one in STREAMS:
        if one.name == name:
            return one
    raise ValueError(f"no stream {name!r} (streams: {', '.join(STREAM_NAMES)})")


def stream_of(family_name: str, kinds: tuple[str, ...] | None = None) -> Stream:
    """The one stream that stores ``kinds`` of family ``family_name`` (None: every kind
    of a family stored whole, or a raw subject of an open kind: the telemetry stream).
    ValueError when they are split between two streams."""
    parts = [s for s in STREAMS if s.family == family_name]
    if not parts:
        raise ValueError(f"no stream family {family_name!r} (families: {', '.join(FAMILY_NAMES)})")
    if len(parts) == 1:
        return parts[0]
    if not kinds:
        return parts[0]
    holding = {s.name: s for s in parts for k in kinds if k in s.kinds}
    if len(holding) != 1:
        raise ValueError(f"{family_name} kinds {list(kinds)} are not in one stream")
    return next(iter(holding.values()))


def streams_of(subject: str) -> tuple[Stream, ...]:
    """The streams that store what subject filter ``subject`` matches (its third token
    names the family): one, or both raw streams for a raw filter of an open kind."""
    tokens = subject.split(".")
    if tokens[2] != "raw":
        return (stream_of(tokens[2]),)
    kind = tokens[4] if len(tokens) > 4 else ">"
    if kind in ("*", ">"):
        return tuple(s for s in STREAMS if s.family == "raw")
    return (stream("raw-faults" if kind in FAULT_GRADE_KINDS else "raw"),)
