"""One agent's commands: live on a core subscription, caught up from the command stream.

A ``launch`` agent takes the commands on its subject ``cmd.<job>.<replica>`` through a
:class:`CommandInbox`, with no consumer in the server: a consumer per agent costs the
server a delivery state each, and a stream refuses consumers beyond its
``max_consumers`` (1,000 by default), while a job may have more replicas than that.

- Live: a core NATS subscription on the subject; a command is handed over as soon as
  the server has it.
- Caught up from the ``cmd`` stream with direct gets (the stream has ``allow_direct``;
  no consumer): at start, after every disconnection (the catch-up is queued when the
  connection drops and runs once it is back, before any command that arrives after
  it), and whenever a check finds a message it has not seen: about every
  :data:`RECHECK_SECONDS` it asks the stream how many messages it holds on the subject
  (stream info, no message read) and compares with the number it has seen (core NATS
  delivers at most once: a message dropped to a slow subscriber is found so; and so is
  one that could not be used, which the catch-up dead-letters).
- Where it starts: after the last command an earlier inbox with the same
  ``position_key`` handled (its record in the ``agent_positions`` bucket: an agent
  started again after a crash goes on where it stopped; the key names the job run, so a
  new run's agent never takes an old run's record); with no record, at the newest
  command on the subject (older ones are superseded). The record is written
  :data:`SAVE_DELAY_SECONDS` after a command was handled (one write for a burst, off
  the path of the next command) and at :meth:`CommandInbox.close`; an agent killed in
  between is given that command again, as a consumer redelivers one it never acked.
- Each command is handed over once, by event id (a publisher's retry reaches core
  subscribers twice; the stream stores it once), in the order the stream stored them,
  except that one arriving live may come before older ones the inbox missed with no
  disconnection (a dropped message). Those are still handed over, once a check finds
  them; the launcher ignores an older generation.
- A handler that raises gets the same command again after :data:`RETRY_SECONDS`, up to
  :data:`MAX_ATTEMPTS` times, before the next one; a
  :class:`~resurge.runtime.bus.PermanentError` sends it to the dead letters at once. A
  stored message that cannot be decoded, or of a kind the handler does not take, is
  dead-lettered once: one that arrives live is skipped there, and a catch-up queued
  behind it reads it back from the stream and dead-letters it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from resurge.contract.subjects import escape_token
from resurge.contract.subscriptions import Reader, Scope, Subscription
from resurge.events import (
    EVENT_KINDS,
    DeadLetterReason,
    DecodeError,
    Envelope,
    Event,
    decode_event,
)
from resurge.runtime.bus import (
    AGENT_POSITIONS_BUCKET,
    DRAIN_TIMEOUT_SECONDS,
    Bus,
    PermanentError,
)
from resurge.runtime.logs import RateLimitedLog

__all__ = [
    "MAX_ATTEMPTS",
    "RECHECK_SECONDS",
    "RETRY_SECONDS",
    "SAVE_DELAY_SECONDS",
    "CommandInbox",
    "position_key",
]

# How often the stream is read for commands the live subscription may have missed.
RECHECK_SECONDS = 30.0
# A failed handler, or a failed read of the stream, is tried again after this long.
RETRY_SECONDS = 1.0
# Tries of one command before it is given up (as a consumer's max_deliver).
MAX_ATTEMPTS = 10
# A handled command's position is recorded this long after it (coalescing a burst).
SAVE_DELAY_SECONDS = 0.25
# Event ids remembered to hand each command over once.
_SEEN = 4096
# Ids handled live and not yet read back from the stream, kept in the position record.
_UNREAD = 256

log = logging.getLogger("resurge.runtime.command_inbox")

T = TypeVar("T")
# What the inbox's task runs besides live messages.
_CATCH_UP = "catch up"
_CHECK = "check"


def _msg_id(headers: dict[str, str] | None) -> str | None:
    """The ``Nats-Msg-Id`` header: the event id, as :meth:`Bus.publish` sets it."""
    return None if headers is None else headers.get("Nats-Msg-Id")


class _Lost(Exception):
    """The connection dropped while a read of the stream waited for its answer."""


Handler = Callable[[Any], Awaitable[None]]


def position_key(node: str, job: str, replica: int, incarnation: int, uid: str = "") -> str:
    """The ``agent_positions`` key of one agent: node first, so a node's user may be
    allowed its own keys only (``<node>.>``); ``uid``, the job run's, last, so the first
    agent of a new run of a job by the same name does not go on where the old run's
    agent stopped (both are incarnation 0)."""
    key = f"{escape_token(node)}.{escape_token(job)}.{replica}.{incarnation}"
    return f"{key}.{escape_token(uid)}" if uid else key


class CommandInbox:
    """The commands on ``subject`` for one agent, each handed to ``handler`` once (see
    the module docstring). ``expects`` lists the kinds the handler takes (empty: any);
    ``position_key`` None keeps no position (a new inbox starts at the newest command).
    """

    def __init__(
        self,
        bus: Bus,
        subject: str,
        handler: Handler,
        *,
        expects: tuple[type[Envelope], ...] = (),
        position_key: str | None = None,
        recheck_seconds: float = RECHECK_SECONDS,
    ) -> None:
        self.bus = bus
        self.subject = subject
        self.handler = handler
        self.expects = expects
        self.key = position_key
        self.recheck_seconds = recheck_seconds
        self.stream = bus.subjects.stream("cmd")
        # Live messages (data, Nats-Msg-Id), and the catch-ups and checks to run.
        self._queue: asyncio.Queue[tuple[bytes, str | None] | str] = asyncio.Queue()
        self._queued: set[str] = set()
        # How many messages the stream should hold on the subject, if all were seen.
        self._expected: int | None = None
        self._connected = asyncio.Event()
        self._lost = asyncio.Event()  # set from a disconnection until the catch-up after it
        self._next_seq = 1  # the stream sequence the next catch-up reads from
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._unread: list[str] = []  # handled live, not yet read back from the stream
        self._positions: KeyValue | None = None
        self._unsaved = asyncio.Event()
        self._idle = asyncio.Event()  # no handler running
        self._idle.set()
        self._sub: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._errors = RateLimitedLog(log, interval=30.0)

    @classmethod
    def declared(
        cls,
        bus: Bus,
        entry: Subscription,
        scope: Scope,
        handler: Handler,
        **options: Any,
    ) -> CommandInbox:
        """The inbox of declared subscription ``entry`` (a command-inbox reader of
        :mod:`resurge.contract.subscriptions`), ``scope`` naming its job and replica."""
        if entry.reader is not Reader.INBOX:
            raise ValueError(f"{entry.service}/{entry.name} is not read by a command inbox")
        expects = tuple(EVENT_KINDS[k] for k in entry.kinds)
        return cls(bus, entry.subject(bus.subjects, scope), handler, expects=expects, **options)

    async def start(self) -> None:
        """Subscribe, find where to start, and hand commands over from then on (in a
        task of its own, until :meth:`close`). Raises what the bus raises, a denied
        subscription or read among them."""
        self._sub = await self.bus.nc.subscribe(self.subject, cb=self._on_live)
        if self.bus.connected:
            self._connected.set()
        self.bus.on_connection_change(self._connection_changed)
        if self.key is not None:
            self._positions = await self.bus.key_value(AGENT_POSITIONS_BUCKET)
        await self._find_start()
        self._queue_catch_up()
        self._tasks = [
            asyncio.create_task(self._run(), name=f"commands {self.subject}"),
            asyncio.create_task(self._recheck(), name=f"command recheck {self.subject}"),
        ]
        if self._positions is not None:
            self._tasks.append(asyncio.create_task(self._saver(), name=f"position {self.key}"))

    async def close(self) -> None:
        """Stop taking commands, and record the position if it moved since it was last
        recorded. A handler running now is given up to ``DRAIN_TIMEOUT_SECONDS`` to
        finish (as the bus drains a subscription's), then cancelled."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), DRAIN_TIMEOUT_SECONDS)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._unsaved.is_set() and self.bus.connected:
            await self._save()
        if self._sub is not None and not self.bus.nc.is_closed:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
        self._sub = None

    async def _find_start(self) -> None:
        if self._positions is not None and self.key is not None:
            try:
                entry = await self._positions.get(self.key)
            except nats.js.errors.KeyNotFoundError:
                pass
            else:
                record = json.loads(entry.value or b"{}")
                self._next_seq = int(record["next"])
                self._unread = [str(i) for i in record.get("unread", [])][-_UNREAD:]
                for event_id in self._unread:
                    self._remember(event_id)
                return
        try:
            newest = await self.bus.js.get_last_msg(self.stream, self.subject, direct=True)
        except nats.js.errors.NotFoundError:
            return  # nothing stored yet: whatever comes is newer than sequence 1
        self._next_seq = newest.seq or 1

    async def _on_live(self, msg: Msg) -> None:
        self._queue.put_nowait((msg.data, _msg_id(msg.headers)))

    def _connection_changed(self, connected: bool) -> None:
        if not self._tasks:  # closed (the bus keeps its listeners)
            return
        if connected:
            self._connected.set()
            return
        self._connected.clear()
        self._lost.set()
        self._queue_catch_up()

    def _queue_catch_up(self) -> None:
        self._queue_step(_CATCH_UP)

    def _queue_step(self, step: str) -> None:
        if step not in self._queued:
            self._queued.add(step)
            self._queue.put_nowait(step)

    async def _recheck(self) -> None:
        # Spread over half to one and a half periods: agents started together (a job's
        # replicas) do not all ask at once.
        while True:
            await asyncio.sleep(self.recheck_seconds * random.uniform(0.5, 1.5))
            self._queue_step(_CHECK)

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, tuple):
                await self._offer(*item, stored=False)
                continue
            self._queued.discard(item)
            if item == _CHECK:
                await self._check()
            else:
                await self._catch_up()

    async def _check(self) -> None:
        """Catch up only if the stream holds another number of messages on the subject
        than this inbox has seen (one small request, no message read back)."""
        try:
            info = await self._unless_lost(
                self.bus.js.stream_info(self.stream, subjects_filter=self.subject)
            )
        except (_Lost, nats.errors.Error, nats.js.errors.Error, TimeoutError):
            await self._catch_up()
            return
        stored = (info.state.subjects or {}).get(self.subject, 0)
        if stored != self._expected:
            await self._catch_up()
            return
        # Every message up to the stream's last was seen: the position moves past them.
        if info.state.last_seq + 1 > self._next_seq:
            self._next_seq = info.state.last_seq + 1
            self._unread = []
            self._unsaved.set()

    async def _catch_up(self) -> None:
        """Hand over every command stored from ``_next_seq`` on, retrying reads until
        they succeed (the connection may be down)."""
        while True:
            await self._connected.wait()
            self._lost.clear()
            try:
                await self._read_stored()
                return
            except _Lost:
                continue
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as error:
                self._errors.warning(
                    type(error).__name__, f"reading commands on {self.subject}: {error!r}"
                )
            await asyncio.sleep(RETRY_SECONDS)

    async def _read_stored(self) -> None:
        """Read on from ``_next_seq`` to the end, and count the subject's messages: the
        stream's count before the reads, and those the reads found stored after it."""
        info = await self._unless_lost(
            self.bus.js.stream_info(self.stream, subjects_filter=self.subject)
        )
        counted_to = info.state.last_seq
        expected = (info.state.subjects or {}).get(self.subject, 0)
        while True:
            try:
                msg = await self._unless_lost(
                    self.bus.js.get_msg(
                        self.stream,
                        seq=self._next_seq,
                        subject=self.subject,
                        direct=True,
                        next=True,
                    )
                )
            except nats.js.errors.NotFoundError:
                self._expected = expected
                return
            seq = msg.seq or self._next_seq
            expected += seq > counted_to
            await self._offer(msg.data or b"", _msg_id(msg.headers), stored=True)
            # Moved on only once handled: an agent stopped meanwhile is given it again.
            self._next_seq = seq + 1
            self._unsaved.set()

    async def _unless_lost(self, request: Awaitable[T]) -> T:
        """``request``'s answer; raises :class:`_Lost` at once when the connection drops
        meanwhile (the answer would never come)."""
        answer = asyncio.ensure_future(request)
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            done, _ = await asyncio.wait((answer, lost), return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not answer.done():
                answer.cancel()
        if answer not in done:
            raise _Lost
        return answer.result()

    async def _offer(self, data: bytes, msg_id: str | None, *, stored: bool) -> None:
        """Hand ``data`` over unless it was already (known by its ``Nats-Msg-Id``, the
        event id, without decoding it), or cannot be (dead-lettered when ``stored``:
        read from the stream, where each message is read once)."""
        if msg_id is not None and self._handled(msg_id, stored):
            return
        event = await self._decode(data, stored)
        if event is None:
            if not stored:  # read back from the stream, where it is dead-lettered once
                self._queue_catch_up()
            return
        if self._handled(event.id, stored):
            return
        if not stored and self._expected is not None:
            self._expected += 1
        self._remember(event.id)
        await self._hand_over(event, data)
        if not stored:
            self._unread = [*self._unread, event.id][-_UNREAD:]
            self._unsaved.set()

    async def _decode(self, data: bytes, stored: bool) -> Event | None:
        try:
            event = decode_event(data)
        except DecodeError as error:
            if stored:
                await self.bus.dead_letters.send(self.subject, data, error.reason, error.detail)
            return None
        if self.expects and not isinstance(event, self.expects):
            if stored:
                wanted = ", ".join(sorted(m.model_fields["kind"].default for m in self.expects))
                detail = f"kind {event.kind!r} on {self.subject}; this agent takes {wanted}"
                await self.bus.dead_letters.send(
                    self.subject, data, DeadLetterReason.UNEXPECTED_KIND, detail
                )
            return None
        return event

    def _handled(self, event_id: str, stored: bool) -> bool:
        """Whether ``event_id`` was handed over already (read back from the stream, it
        is no longer unread)."""
        if event_id not in self._seen:
            return False
        if stored and event_id in self._unread:
            self._unread.remove(event_id)
        return True

    def _remember(self, event_id: str) -> None:
        self._seen[event_id] = None
        while len(self._seen) > _SEEN:
            self._seen.popitem(last=False)

    async def _hand_over(self, event: Event, data: bytes) -> None:
        self._idle.clear()
        try:
            await self._try_handler(event, data)
        finally:
            self._idle.set()

    async def _try_handler(self, event: Event, data: bytes) -> None:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                await self.handler(event)
                return
            except PermanentError as error:
                await self.bus.dead_letters.send(
                    self.subject, data, DeadLetterReason.INVALID, str(error)
                )
                return
            except Exception as error:
                last = attempt == MAX_ATTEMPTS
                log.log(
                    logging.ERROR if last else logging.WARNING,
                    "handling %s failed (try %d of %d)%s: %r",
                    event.kind,
                    attempt,
                    MAX_ATTEMPTS,
                    "; giving it up" if last else ", will retry",
                    error,
                    extra={"event_id": event.id, "kind": event.kind, "job": event.job},
                )
            if attempt < MAX_ATTEMPTS:
                await asyncio.sleep(RETRY_SECONDS)

    async def _saver(self) -> None:
        while True:
            await self._unsaved.wait()
            await asyncio.sleep(SAVE_DELAY_SECONDS)
            await self._save()

    async def _save(self) -> None:
        """Record where this agent is (a failure is logged and tried again later)."""
        if self._positions is None or self.key is None:
            return
        self._unsaved.clear()
        record = {"next": self._next_seq, "unread": self._unread}
        try:
            await self._positions.put(self.key, json.dumps(record).encode())
        except asyncio.CancelledError:
            self._unsaved.set()  # not known to be written: close() writes it
            raise
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as error:
            self._unsaved.set()
            self._errors.warning(
                type(error).__name__, f"saving the command position of {self.key}: {error!r}"
            )
            await asyncio.sleep(RETRY_SECONDS)
