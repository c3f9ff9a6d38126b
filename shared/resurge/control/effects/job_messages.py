"""What restarter and scaler send about a job: commands to its agents, phase changes.

Each function reads the job record and publishes; none decides anything. Decisions
are made and written (compare-and-set) before these are called.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable

from resurge.control.decisions.planner import assignments, command_id
from resurge.control.state.records import JobRecord, Placement
from resurge.events import (
    CheckpointNow,
    Envelope,
    JobPhase,
    PhaseChanged,
    RecoveryLevel,
    Stop,
    StopFirst,
)
from resurge.runtime.bus import Bus

__all__ = [
    "PUBLISH_WINDOW",
    "announce_phase",
    "assignment_messages",
    "phase_message",
    "publish_all",
    "send_assignments",
    "send_checkpoint_requests",
    "send_stops",
    "stop_messages",
]

# Commands to one job's replicas in flight at once (sent, their stream acks awaited).
PUBLISH_WINDOW = 256


async def publish_all(bus: Bus, messages: Iterable[tuple[str, Envelope]]) -> None:
    """Publish every ``(subject, event)``, at most :data:`PUBLISH_WINDOW` awaiting their
    stream acks at once, and return once all are stored; raise the first failure (after
    the rest of its window finished). Sent in order on one connection, so one subject's
    messages are stored in the order given; one round trip per window, not per message.
    """
    window: list[tuple[str, Envelope]] = []

    async def send() -> None:
        results = await asyncio.gather(
            *(bus.publish(subject, event) for subject, event in window), return_exceptions=True
        )
        window.clear()
        for result in results:
            if isinstance(result, BaseException):
                raise result

    for message in messages:
        window.append(message)
        if len(window) >= PUBLISH_WINDOW:
            await send()
    if window:
        await send()


async def send_stops(
    bus: Bus,
    record: JobRecord,
    generation: int,
    reason: str,
    *,
    final: bool = False,
    placements: list[Placement] | None = None,
    hung_ranks: list[int] | None = None,
    graceful: bool = True,
) -> None:
    """Stop(generation) to every replica of ``record`` (or of ``placements``); ``final``
    also ends the agents. Workers get SIGTERM and the job's ``stopGraceSeconds``, except
    the global ranks in ``hung_ranks`` (SIGKILLed at once), or every worker at once when
    ``graceful`` is false."""
    stops = stop_messages(
        bus,
        record,
        generation,
        reason,
        final=final,
        placements=placements,
        hung_ranks=hung_ranks,
        graceful=graceful,
    )
    await publish_all(bus, stops)


def stop_messages(
    bus: Bus,
    record: JobRecord,
    generation: int,
    reason: str,
    *,
    final: bool = False,
    placements: list[Placement] | None = None,
    hung_ranks: list[int] | None = None,
    graceful: bool = True,
) -> list[tuple[str, Envelope]]:
    """The ``(subject, Stop)`` pairs :func:`send_stops` publishes, for sending them in one
    window with other messages (:func:`publish_all`)."""
    stops: list[tuple[str, Envelope]] = []
    for placement in record.placements if placements is None else placements:
        kind = "stop-final" if final else "stop"
        stop = Stop(
            id=command_id(kind, record.name, placement.replica, generation, record.uid),
            source=bus.source,
            job=record.name,
            uid=record.uid,
            replica=placement.replica,
            generation=generation,
            final=final,
            graceful=graceful,
            timeout_seconds=record.spec.spec.recovery.stop_grace_seconds,
            hung_ranks=hung_ranks or [],
            reason=reason,
        )
        stops.append((bus.subjects.cmd(record.name, placement.replica), stop))
    return stops


async def send_checkpoint_requests(
    bus: Bus, record: JobRecord, reason: str, hold_seconds: float = 0.0
) -> None:
    """CheckpointNow(record.generation) to every replica of ``record``: its workers that
    use ``resurge.worker`` save a checkpoint and report it (CheckpointSaved), then hold
    for at most ``hold_seconds`` (0: not at all) until they are stopped or restarted. The
    ids derive from job, replica, generation and ``reason``, so sending the same request
    twice (within JetStream's de-duplication window) is de-duplicated; waiting for the
    reports is the caller's."""
    for placement in record.placements:
        request = CheckpointNow(
            id=command_id(
                f"checkpoint-{_digest(reason)}",
                record.name,
                placement.replica,
                record.generation,
                record.uid,
            ),
            source=bus.source,
            job=record.name,
            uid=record.uid,
            replica=placement.replica,
            generation=record.generation,
            reason=reason,
            hold_seconds=hold_seconds,
        )
        await bus.publish(bus.subjects.cmd(record.name, placement.replica), request)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


async def send_assignments(bus: Bus, record: JobRecord, level: RecoveryLevel | None = None) -> None:
    """Assign(record.generation) to every replica of ``record``."""
    await publish_all(bus, assignment_messages(bus, record, level))


def assignment_messages(
    bus: Bus,
    record: JobRecord,
    level: RecoveryLevel | None = None,
    stop: StopFirst | None = None,
) -> list[tuple[str, Envelope]]:
    """The ``(subject, Assign)`` pairs :func:`send_assignments` publishes; ``stop``: what
    each Assign stops first (instead of a Stop of its own)."""
    commands: list[tuple[str, Envelope]] = []
    for assign in assignments(record, bus.source, level, stop):
        assert assign.replica is not None
        commands.append((bus.subjects.cmd(record.name, assign.replica), assign))
    return commands


async def announce_phase(bus: Bus, before: JobPhase | None, after: JobRecord) -> None:
    """Publish PhaseChanged on the job's action subject if the phase changed."""
    message = phase_message(bus, before, after)
    if message is not None:
        await bus.publish(*message)


def phase_message(
    bus: Bus, before: JobPhase | None, after: JobRecord
) -> tuple[str, Envelope] | None:
    """The ``(subject, PhaseChanged)`` :func:`announce_phase` publishes; None when the
    phase did not change."""
    if before == after.phase:
        return None
    event = PhaseChanged(
        id=f"phase-{command_id(after.phase.value, after.name, 0, after.generation, after.uid)}",
        source=bus.source,
        job=after.name,
        generation=after.generation,
        phase=after.phase,
        previous=before,
        message=after.message,
    )
    return bus.subjects.action(after.name), event
