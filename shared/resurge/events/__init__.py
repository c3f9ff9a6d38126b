"""Every message kind, the union over ``kind``, and decoding with reasons.

:func:`decode_event` turns bytes into the right model or raises :class:`DecodeError`
carrying a :class:`DeadLetterReason`, so every subscriber classifies bad input the same
way.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from resurge.contract.vocabulary import FaultScope, JobPhase, RecoveryLevel
from resurge.events.actions import PhaseChanged, RecoveryFinished, RecoveryStarted, ScaleDecided
from resurge.events.capacity import CapacityChanged
from resurge.events.commands import (
    Assign,
    CheckpointNow,
    InjectFault,
    InjectGpuError,
    RepairNode,
    ReplicaSlot,
    Stop,
    StopFirst,
)
from resurge.events.dead_letters import DeadLetter, DeadLetterReason
from resurge.events.envelope import SCHEMA_VERSION, Envelope, Source
from resurge.events.faults import FaultDetected, Severity
from resurge.events.gpu import (
    CheckNode,
    GpuError,
    GpuReading,
    GpuReset,
    GpuSample,
    NodeChecked,
    NodeReport,
    ResetGpu,
)
from resurge.events.jobs import JobDeleted, JobSubmitted, ReplicaFinished
from resurge.events.progress import (
    RESTORE_SOURCES,
    CheckpointSaved,
    Progress,
    RestoreSource,
    StateRestored,
    WorkerFault,
)
from resurge.events.raw import (
    AgentState,
    AgentStateChanged,
    LogLine,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    RendezvousPassed,
)

__all__ = [
    "EVENT_KINDS",
    "RESTORE_SOURCES",
    "SCHEMA_VERSION",
    "AgentState",
    "AgentStateChanged",
    "Assign",
    "CapacityChanged",
    "CheckNode",
    "CheckpointNow",
    "CheckpointSaved",
    "DeadLetter",
    "DeadLetterReason",
    "DecodeError",
    "Envelope",
    "Event",
    "FaultDetected",
    "FaultScope",
    "GpuError",
    "GpuReading",
    "GpuReset",
    "GpuSample",
    "InjectFault",
    "InjectGpuError",
    "JobDeleted",
    "JobPhase",
    "JobSubmitted",
    "LogLine",
    "NodeChecked",
    "NodeReport",
    "PhaseChanged",
    "ProcessExited",
    "ProcessStarted",
    "ProcessStateChanged",
    "Progress",
    "RecoveryFinished",
    "RecoveryLevel",
    "RecoveryStarted",
    "RendezvousPassed",
    "RepairNode",
    "ReplicaFinished",
    "ReplicaSlot",
    "ResetGpu",
    "RestoreSource",
    "ScaleDecided",
    "Severity",
    "Source",
    "StateRestored",
    "Stop",
    "StopFirst",
    "WorkerFault",
    "decode_event",
    "encode_event",
]

_MODELS: tuple[type[Envelope], ...] = (
    ProcessStarted,
    ProcessExited,
    ProcessStateChanged,
    RendezvousPassed,
    LogLine,
    AgentStateChanged,
    Progress,
    CheckpointSaved,
    StateRestored,
    WorkerFault,
    CapacityChanged,
    GpuSample,
    GpuError,
    NodeReport,
    FaultDetected,
    Assign,
    Stop,
    CheckpointNow,
    InjectFault,
    InjectGpuError,
    RepairNode,
    ResetGpu,
    GpuReset,
    CheckNode,
    NodeChecked,
    RecoveryStarted,
    RecoveryFinished,
    ScaleDecided,
    PhaseChanged,
    JobSubmitted,
    JobDeleted,
    ReplicaFinished,
    DeadLetter,
)

Event = Annotated[
    ProcessStarted
    | ProcessExited
    | ProcessStateChanged
    | RendezvousPassed
    | LogLine
    | AgentStateChanged
    | Progress
    | CheckpointSaved
    | StateRestored
    | WorkerFault
    | CapacityChanged
    | GpuSample
    | GpuError
    | NodeReport
    | FaultDetected
    | Assign
    | Stop
    | CheckpointNow
    | InjectFault
    | InjectGpuError
    | RepairNode
    | ResetGpu
    | GpuReset
    | CheckNode
    | NodeChecked
    | RecoveryStarted
    | RecoveryFinished
    | ScaleDecided
    | PhaseChanged
    | JobSubmitted
    | JobDeleted
    | ReplicaFinished
    | DeadLetter,
    Field(discriminator="kind"),
]

EVENT_KINDS: dict[str, type[Envelope]] = {
    model.model_fields["kind"].default: model for model in _MODELS
}

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
# The adapter's compiled validator, called without the adapter's per-call set-up.
_validate_json = EVENT_ADAPTER.validator.validate_json


class DecodeError(ValueError):
    """A message that is not a valid event; ``reason`` says which way it is wrong."""

    def __init__(self, reason: DeadLetterReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def encode_event(event: Envelope) -> bytes:
    """The message body of ``event``: its JSON, field aliases as the schemas name them."""
    return event.model_dump_json(by_alias=True).encode()


def decode_event(data: bytes) -> Event:
    """Decode one message body, or raise :class:`DecodeError` (and nothing else)."""
    try:  # the fast path: pydantic-core parses and validates in one go
        event: Event = _validate_json(data)
    except ValueError:
        pass  # find out why, below
    else:
        if event.schema_version != SCHEMA_VERSION:
            _check_version(event)
        return event
    try:
        document: Any = json.loads(data)
    # Bad UTF-8 and bad JSON, but also an integer of more digits than Python converts
    # (a plain ValueError) and nesting deeper than the parser's recursion.
    except (ValueError, RecursionError) as error:
        raise DecodeError(DeadLetterReason.NOT_JSON, str(error)[:500]) from None
    if not isinstance(document, dict):
        raise DecodeError(DeadLetterReason.INVALID, "a message must be a JSON object")
    kind = document.get("kind")
    if not isinstance(kind, str) or kind not in EVENT_KINDS:  # a list is not even hashable
        raise DecodeError(
            DeadLetterReason.UNKNOWN_KIND,
            f"kind {str(kind)[:100]!r} is not one of {', '.join(sorted(EVENT_KINDS))}",
        )
    try:
        event = EVENT_ADAPTER.validate_python(document)
    except ValidationError as error:
        details = "; ".join(
            f"{'.'.join(str(p) for p in item['loc'][1:]) or '(event)'}: {item['msg']}"
            for item in error.errors()
        )
        raise DecodeError(DeadLetterReason.INVALID, details) from None
    _check_version(event)
    return event


def _check_version(event: Envelope) -> None:
    """A schema version this build does not know is refused, never half-understood."""
    if event.schema_version != SCHEMA_VERSION:
        raise DecodeError(
            DeadLetterReason.INVALID,
            f"schema_version: {event.schema_version} is not supported; "
            f"this build reads {event.kind} version {SCHEMA_VERSION}",
        )
