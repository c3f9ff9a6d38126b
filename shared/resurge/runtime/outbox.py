"""The outbox: events a party could not send yet, kept in order and sent once it can.

An agent publishes what it sees through an :class:`Outbox` instead of straight onto
the bus, so a NATS outage (the server restarting, a network cut) loses nothing that
matters and never holds the agent up:

- :meth:`Outbox.put` never blocks and never raises: it queues the event and returns.
  A background task (:meth:`Outbox.run`) sends the queue, oldest first, whenever the
  bus is connected, and waits while it is not.
- Order is kept: events are sent in the order they were put, so while anything is
  queued a new event queues behind it (a fresh event never overtakes a backlog).
- Essential events (everything that is not telemetry: a process start or exit, an
  agent's state, a worker's fault, a checkpoint, a GPU error) are sent with
  :meth:`~resurge.runtime.bus.Bus.publish` and leave the queue only once the stream
  acked them: a failed or timed-out send is tried again, with the same event id as
  ``Nats-Msg-Id``, so a send that reached the stream before its ack was lost is stored
  once. They are never dropped: only a server that answers with an error (other than
  "unavailable", which a restarting server answers) refuses one for good, which is
  logged and counted (``resurge_outbox_refused_total``).
- Telemetry (:data:`TELEMETRY_KINDS`: log lines, progress, GPU samples and node
  reports, the high-rate kinds a later one supersedes) is sent once, without waiting
  for the ack and without ``Nats-Msg-Id`` (:meth:`~resurge.runtime.bus.Bus.publish_nowait`);
  one that cannot be handed to the connection is dropped and counted.
- Bounded: the queue holds at most ``capacity`` events. When a new event would pass
  that, the oldest queued telemetry is dropped (counted by kind); where nothing but
  essential events is queued, a new telemetry event is dropped instead, and a new
  essential event is queued all the same (essential events come at the pace of
  process starts and exits, not of training steps, so they stay few).
- Metrics, in the party's registry: ``resurge_outbox_buffered_events`` (queued now,
  the event being sent included) and ``resurge_outbox_dropped_total`` by kind.

:meth:`Outbox.close` sends what is left for a short while (a stopping agent's last
state), then stops the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import nats.js.errors
from prometheus_client import CollectorRegistry, Counter, Gauge

from resurge.events import Envelope

__all__ = ["DEFAULT_CAPACITY", "TELEMETRY_KINDS", "Outbox", "Publisher"]

# High-rate kinds that a later event of the same kind supersedes: dropped first.
TELEMETRY_KINDS = frozenset({"log_line", "progress", "gpu_sample", "node_report"})

# Events an outbox holds before it drops telemetry (a few MiB of log lines).
DEFAULT_CAPACITY = 10_000

# A send that failed while the bus said it was connected is tried again after this long.
_RETRY_SECONDS = 0.2
# While the bus is down the task looks this often whether it is back.
_POLL_SECONDS = 0.1

log = logging.getLogger("resurge.runtime.outbox")


class Publisher(Protocol):
    """What an outbox sends through (:class:`~resurge.runtime.bus.Bus` is one)."""

    @property
    def connected(self) -> bool:
        """Whether the connection is up now."""
        ...

    async def publish(self, subject: str, event: Envelope) -> None:
        """Store ``event`` and wait for the stream's ack; raise if it was not acked."""
        ...

    async def publish_nowait(self, subject: str, event: Envelope) -> None:
        """Hand ``event`` to the connection without waiting for the stream's ack."""
        ...


@dataclass(frozen=True)
class _Item:
    seq: int
    subject: str
    event: Envelope


class Outbox:
    """A bounded, ordered, priority-aware queue of events to publish (see the module
    docstring). Start :meth:`run` as a task; :meth:`put` from anywhere in the loop."""

    def __init__(
        self,
        publisher: Publisher,
        registry: CollectorRegistry,
        *,
        capacity: int = DEFAULT_CAPACITY,
        telemetry_kinds: frozenset[str] = TELEMETRY_KINDS,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"an outbox holds at least one event, not {capacity}")
        self.publisher = publisher
        self.capacity = capacity
        self.telemetry_kinds = telemetry_kinds
        self._essential: deque[_Item] = deque()
        self._telemetry: deque[_Item] = deque()
        self._sending: _Item | None = None
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._task: asyncio.Task[None] | None = None
        self._buffered = Gauge(
            "resurge_outbox_buffered_events",
            "Events waiting in the outbox to be published (the one being sent included).",
            registry=registry,
        )
        self._dropped = Counter(
            "resurge_outbox_dropped_total",
            "Telemetry events the outbox dropped (full, or not accepted by the connection).",
            ["kind"],
            registry=registry,
        )
        self._refused = Counter(
            "resurge_outbox_refused_total",
            "Essential events the server refused for good (an error answer, not a timeout).",
            ["kind"],
            registry=registry,
        )
        self._buffered.set_function(lambda: self.buffered)

    @property
    def buffered(self) -> int:
        """Events queued now, the one being sent included."""
        return len(self._essential) + len(self._telemetry) + (self._sending is not None)

    def essential(self, event: Envelope) -> bool:
        """Whether ``event`` must never be dropped."""
        return event.kind not in self.telemetry_kinds

    def put(self, subject: str, event: Envelope) -> None:
        """Queue ``event`` for ``subject`` behind everything queued; never blocks."""
        item = _Item(next(self._seq), subject, event)
        essential = self.essential(event)
        if self.buffered >= self.capacity:
            if self._telemetry:
                self._drop(self._telemetry.popleft().event)
            elif not essential:
                self._drop(event)
                return
        (self._essential if essential else self._telemetry).append(item)
        self._empty.clear()
        self._wake.set()

    def _drop(self, event: Envelope) -> None:
        self._dropped.labels(event.kind).inc()

    def _next(self) -> _Item | None:
        """Take the oldest queued event off its queue (None when both are empty)."""
        essential, telemetry = self._essential, self._telemetry
        if essential and (not telemetry or essential[0].seq < telemetry[0].seq):
            return essential.popleft()
        if telemetry:
            return telemetry.popleft()
        return None

    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` as a task of the running loop (once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run())
        return self._task

    async def run(self) -> None:
        """Send the queue whenever the bus is connected, oldest first; runs until cancelled."""
        while True:
            if self.buffered == 0:
                self._empty.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self.publisher.connected:
                await asyncio.sleep(_POLL_SECONDS)
                continue
            item = self._sending = self._next()
            if item is None:  # unreachable: buffered counted a queued event
                continue
            try:
                sent = await self._send(item)
            finally:
                self._sending = None
            if not sent:  # back at the head of its queue, in its place
                (self._essential if self.essential(item.event) else self._telemetry).appendleft(
                    item
                )
                await asyncio.sleep(_RETRY_SECONDS)

    async def _send(self, item: _Item) -> bool:
        """Send one event; False where it is to be tried again."""
        try:
            if self.essential(item.event):
                await self.publisher.publish(item.subject, item.event)
            else:
                await self.publisher.publish_nowait(item.subject, item.event)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if not self.essential(item.event):
                self._drop(item.event)  # the connection's own buffer is full: let it go
                return True
            if _refused(error):
                log.error(
                    "the stream refused %s; not sending it again: %r",
                    item.event.kind,
                    error,
                    extra={"event_id": item.event.id},
                )
                self._refused.labels(item.event.kind).inc()
                return True
            log.warning(
                "could not publish %s yet (%d queued), trying again: %r",
                item.event.kind,
                self.buffered,
                error,
                extra={"event_id": item.event.id},
            )
            return False
        return True

    async def flushed(self, wait_seconds: float) -> bool:
        """Wait until everything queued was sent, at most ``wait_seconds``; whether it was."""
        try:
            await asyncio.wait_for(self._empty.wait(), wait_seconds)
        except TimeoutError:
            return False
        return True

    async def close(self, wait_seconds: float = 5.0) -> None:
        """Send what is left for up to ``wait_seconds``, then stop the task."""
        task = self._task
        if task is not None and not task.done() and not await self.flushed(wait_seconds):
            log.warning("stopping with %d event(s) not published", self.buffered)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _refused(error: Exception) -> bool:
    """Whether the server answered a publish with an error that a retry will not mend (a
    JetStream error other than "unavailable", which a restarting server answers)."""
    return isinstance(error, nats.js.errors.APIError) and not isinstance(
        error, nats.js.errors.ServiceUnavailableError
    )
