"""A job's history read back from the durable streams, in time order.

:func:`read_history` reads every stored event of the families asked for (one ordered
consumer per stream, ephemeral, deleted as it ends: a viewer's rights suffice) from
``since`` up to the newest message stored when the read began, and returns them sorted
by event time. With ``job`` only that job's subjects are read. Raw telemetry is read
only for the kinds a timeline needs (:data:`TIMELINE_RAW_KINDS`) unless ``raw_kinds``
says otherwise (the raw family is stored in two streams, its fault-grade kinds apart:
both are read); the raw streams keep an hour by default, the others a day.

A message that does not decode is skipped and counted in :attr:`History.skipped`:
history is for people, and the services dead-letter such messages already.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from resurge.contract.families import streams_of
from resurge.contract.subjects import Subjects
from resurge.events import DecodeError, Event, decode_event
from resurge.runtime.bus import Bus, until_jetstream

__all__ = ["FAMILIES", "TIMELINE_RAW_KINDS", "History", "Stored", "read_history"]

# The families a history reads by default: the life of jobs, what was done to them,
# the faults found, the nodes' capacity and the raw kinds below.
FAMILIES = ("job", "action", "fault", "capacity", "raw")
# Raw kinds that mark a timeline: steps, rendezvous passed, process exits, agents lost,
# checkpoints, where a generation's state came from.
TIMELINE_RAW_KINDS = (
    "progress",
    "rendezvous_passed",
    "process_exited",
    "agent_state",
    "checkpoint_saved",
    "restored",
)

# How long one stream's read may go without a message before it is taken as done.
_QUIET_SECONDS = 5.0


@dataclass(frozen=True)
class Stored:
    """One event as stored: its subject, and the event."""

    subject: str
    event: Event


@dataclass
class History:
    """Events in time order, and how many stored messages could not be decoded."""

    events: list[Stored] = field(default_factory=list)
    skipped: int = 0


def _filters(
    subjects: Subjects, family: str, job: str | None, raw_kinds: Iterable[str] | None
) -> list[str]:
    """The subject filters of ``family`` for ``job`` (``None``: every job)."""
    if family == "raw":
        kinds = TIMELINE_RAW_KINDS if raw_kinds is None else tuple(raw_kinds)
        return [subjects.raw(job, kind, None) for kind in kinds]
    if family == "capacity":  # node events: part of a job's history only through its faults
        return [] if job is not None else [subjects.capacity(None)]
    builders = {"job": subjects.job, "action": subjects.action}
    if family in builders:
        return [builders[family](job)]
    if family == "cmd":
        return [subjects.cmd(job, None)]
    if family == "fault":
        return [subjects.fault(job, None)]
    return [f"{subjects.root}.{family}.>"]


async def read_history(
    bus: Bus,
    *,
    job: str | None = None,
    since: datetime | None = None,
    families: Iterable[str] = FAMILIES,
    raw_kinds: Iterable[str] | None = None,
    subject: str | None = None,
) -> History:
    """Every stored event of ``families`` (of ``job``, from ``since``), oldest first;
    ``subject``: instead, the events stored under that one subject filter (whose
    third token names the family)."""
    history = History()
    reads = []
    if subject is not None:
        family = subject.split(".")[2]
        if family in ("*", ">"):
            raise ValueError(f"{subject}: name a family (raw, fault, action, ...) first")
        filters = [subject]
    else:
        filters = [f for one in families for f in _filters(bus.subjects, one, job, raw_kinds)]
    for filter_subject in filters:  # a raw filter of an open kind: both raw streams
        for stream in streams_of(filter_subject):
            name = bus.subjects.stream(stream.name)
            reads.append(_read_stream(bus, name, filter_subject, since, history))
    await asyncio.gather(*reads)
    history.events.sort(key=lambda stored: stored.event.time)
    return history


async def _read_stream(
    bus: Bus, stream: str, subject: str, since: datetime | None, history: History
) -> None:
    """Read ``subject``'s stored messages of ``stream`` up to the newest stored now."""
    try:  # on a NATS cluster electing a new leader, asked again until it answers
        info = await until_jetstream(partial(bus.js.stream_info, stream))
    except nats.js.errors.NotFoundError:
        return
    last = info.state.last_seq
    if info.state.messages == 0:
        return
    done = asyncio.Event()
    received = [0]

    async def on_message(msg: Msg) -> None:
        received[0] += 1
        try:
            event = decode_event(msg.data)
        except DecodeError:
            history.skipped += 1
        else:
            if since is None or event.time >= since:  # stored late: its own time counts
                history.events.append(Stored(msg.subject, event))
        meta = msg.metadata
        if meta.sequence.stream >= last or meta.num_pending == 0:
            done.set()

    config = (
        ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=since)
        if since is not None
        else None
    )
    sub = await until_jetstream(
        partial(
            bus.js.subscribe,
            subject,
            stream=stream,
            cb=on_message,
            ordered_consumer=True,
            config=config,
        )
    )
    try:
        consumer = await until_jetstream(sub.consumer_info)
        delivered = consumer.delivered
        if consumer.num_pending == 0 and (delivered is None or not delivered.consumer_seq):
            return  # nothing stored matches
        await _until_done(done, lambda: received[0])
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _until_done(done: asyncio.Event, received: Callable[[], int]) -> None:
    """Until ``done``, or until :data:`_QUIET_SECONDS` pass with no message received
    (the rest is older than ``since`` or was removed meanwhile)."""
    while not done.is_set():
        seen = received()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), _QUIET_SECONDS)
        if received() == seen:
            return
