"""Events as lines people read: ``resurge events`` and the timeline report.

:func:`readable` says what an event means in words (``rank 3 was killed by SIGKILL``),
or returns None for an event a person does not need by default (telemetry, commands,
a progress step that is not a multiple of ``every``). :func:`event_line` is one whole
line: time, job, node and the words, or with ``verbose`` every field, or with
``as_json`` the event as stored. A line is never cut: JSON is printed whole.
"""

from __future__ import annotations

import json

from resurge.events import (
    AgentState,
    AgentStateChanged,
    CapacityChanged,
    CheckpointSaved,
    Event,
    FaultDetected,
    JobDeleted,
    JobSubmitted,
    PhaseChanged,
    ProcessExited,
    Progress,
    RecoveryFinished,
    RecoveryStarted,
    ReplicaFinished,
    ScaleDecided,
    StateRestored,
    WorkerFault,
    encode_event,
)

__all__ = ["event_line", "readable"]

_ENVELOPE = {"id", "kind", "schema_version", "time", "source", "job", "replica", "node", "rank"}


def readable(event: Event, every: int = 100) -> str | None:
    """``event`` in words, or None when it is not shown by default."""
    if isinstance(event, Progress):
        if event.rank != 0 or event.step % max(every, 1):
            return None
        metrics = sorted((k, v) for k, v in event.metrics.items() if k != "total_steps")
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics[:3])
        return f"step {event.step}" + (f" ({shown})" if shown else "")
    return _words(event)


def _words(event: Event) -> str | None:  # noqa: C901  (one branch per kind people read)
    who = _who(event)
    if isinstance(event, FaultDetected):
        alert = "alert" if event.alert_only else "fault"
        level = f", suggests {event.suggested_level.value}" if event.suggested_level else ""
        return f"{alert} {event.reason} ({event.scope.value}{level}): {event.message}"
    if isinstance(event, RecoveryStarted):
        return (
            f"recovery from {event.reason} at {event.level.value} level: generation "
            f"{event.from_generation} -> {event.to_generation}"
        )
    if isinstance(event, RecoveryFinished):
        return (
            f"recovered from {event.reason or 'a fault'} at {event.level.value} level "
            f"in {event.duration_seconds:.2f} s"
        )
    if isinstance(event, PhaseChanged):
        before = f"{event.previous.value} -> " if event.previous else ""
        return f"phase {before}{event.phase.value}" + (
            f": {event.message}" if event.message else ""
        )
    if isinstance(event, ScaleDecided):
        return f"{event.resize} {event.from_replicas} -> {event.to_replicas} replicas: {event.why}"
    if isinstance(event, ProcessExited):
        if event.expected:
            return None
        how = f"was killed by {event.signal}" if event.signal else f"exited {event.exit_code}"
        said = [line.strip() for line in event.last_output if line.strip()]
        return f"{who} {how}" + (f"; its last output: {said[-1]}" if said else "")  # --json: all
    if isinstance(event, AgentStateChanged):  # only a lost agent by default: -v shows all
        if event.state is not AgentState.LOST:
            return None
        return f"agent of replica {event.replica} lost: {event.detail}".rstrip(": ")
    if isinstance(event, WorkerFault):
        return f"{who} raised {event.exception}: {event.message}"
    if isinstance(event, CheckpointSaved) and event.rank == 0:
        return f"checkpoint of step {event.step} saved"
    if isinstance(event, StateRestored) and event.rank == 0:  # -v shows every rank's
        return _restored(event, who)
    if isinstance(event, CapacityChanged):
        health = "healthy" if event.healthy else "unhealthy"
        return f"node {health}, {event.slots_free}/{event.slots_total} GPUs free"
    if isinstance(event, JobSubmitted):
        return "submitted"
    if isinstance(event, JobDeleted):
        return "deleted"
    if isinstance(event, ReplicaFinished):
        return f"replica {event.replica} finished"
    return None


def _restored(event: StateRestored, who: str) -> str:
    if event.step is None:
        return f"{who} started fresh" + (f": {event.detail}" if event.detail else "")
    where = {
        "memory": "its node's memory",
        "peer": "a peer",
        "disk": "the disk checkpoint",
        "start": "nowhere",
    }
    text = f"{who} resumed at step {event.step}, its state from {where[event.origin]}"
    return text + (f": {event.detail}" if event.origin == "disk" and event.detail else "")


def _who(event: Event) -> str:
    if event.rank is not None:
        return f"rank {event.rank}"
    if event.replica is not None:
        return f"replica {event.replica}"
    return "a worker"


def event_line(
    event: Event, *, verbose: bool = False, as_json: bool = False, every: int = 100
) -> str | None:
    """One line for ``event``, or None when it is not shown (see the module docstring)."""
    if as_json:
        return encode_event(event).decode()
    words = readable(event, every)
    if words is None and not verbose:
        return None
    head = f"{event.time:%Y-%m-%d %H:%M:%S} {event.job or '-':<16} {event.node or '-':<10}"
    if verbose:
        body = event.model_dump(exclude=_ENVELOPE, mode="json")
        rank = f" rank={event.rank}" if event.rank is not None else ""
        replica = f" replica={event.replica}" if event.replica is not None else ""
        return f"{head} {event.kind:<17}{replica}{rank} {json.dumps(body)}"
    return f"{head} {words}"
