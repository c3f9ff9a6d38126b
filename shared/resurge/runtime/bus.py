"""The bus: one NATS connection per service, typed publish and consume, streams at start.

- :meth:`Bus.connect` retries the first connection, then reconnects forever; a
  connection whose pings (every ``RESURGE_NATS_PING_SECONDS``) go unanswered
  ``MAX_OUTSTANDING_PINGS`` times in a row (a half-open one: a partition) is dropped
  and reconnected, so an outage is seen in seconds. Every connection change is
  logged, and handed to the listeners of
  :meth:`Bus.on_connection_change` (a party that must not count an outage as
  silence, such as the detector's clock). Durable consumers and core subscriptions
  carry on after a reconnect by themselves, also to a restarted server that kept its
  data folder (the consumers live in the server's store; nats.py subscribes again).
  Ordered consumers (every KV watch) live in the server's memory only: at each
  reconnect the bus creates them again from the message after the last one each had
  (:func:`_renew_ordered_consumers`), rather than leaving them silent until nats.py
  notices two missed heartbeats (10 s or more).
- :meth:`Bus.ensure_streams` creates (or updates) the JetStream streams of DESIGN
  section 2 (:data:`~resurge.contract.families.STREAMS`: the raw family's fault-grade
  kinds in a stream of their own), the job-record bucket and the agents' command
  positions, idempotently.
  The ``cmd`` stream answers direct gets (``allow_direct``): agents read their commands
  from it without a consumer (:mod:`resurge.runtime.command_inbox`).
- :meth:`Bus.publish` stores an event in its stream and waits for the ack, with the
  event id as ``Nats-Msg-Id`` so a repeat is stored once; :meth:`Bus.publish_nowait`
  sends an event once, without waiting and without that header (for high-rate
  telemetry such as log lines: a message sent once has nothing to de-duplicate, and
  the header made every consumer read it about a third slower).
- :meth:`Bus.consume` binds a durable consumer: each message is decoded, checked
  against the kinds the handler expects, and handed over; success acks, a
  :class:`TransientError` (or any other exception) naks with a delay, and a message
  that cannot be decoded is dead-lettered and terminated. No message kills the service.
  A raw event whose body names another job or node than its subject (which is all that
  publish permissions vouch for) is dead-lettered too (``subject_mismatch``), by every
  reader: durable, batches and core subscriptions.
- :meth:`Bus.bind` binds a service's declared subscription
  (:mod:`resurge.contract.subscriptions`) with whichever of those its reader is: the
  services bind only so, so what they read is what the permissions and docs say.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import UserString
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Counter, Gauge

from resurge.contract.families import STREAMS, Stream, stream_of
from resurge.contract.subjects import RAW_KIND_TOKEN, Subjects, raw_subject_mismatch
from resurge.contract.subscriptions import Reader, Scope, Subscription
from resurge.events import (
    EVENT_KINDS,
    DeadLetterReason,
    DecodeError,
    Envelope,
    Event,
    Source,
    decode_event,
    encode_event,
)
from resurge.runtime.dead_letters import DeadLetterOffice
from resurge.runtime.logs import RateLimitedLog
from resurge.runtime.nats_auth import CredentialsError, connect_options
from resurge.runtime.settings import Settings
from resurge.runtime.user_renewal import keep_user_fresh

__all__ = [
    "AGENT_POSITIONS_BUCKET",
    "ALLOCATIONS_BUCKET",
    "NODE_HEALTH_BUCKET",
    "BatchReader",
    "Bus",
    "Handler",
    "PermanentError",
    "TransientError",
    "stream_of_subject",
    "until_jetstream",
]

# A stopping service waits this long for its subscriptions' handlers to finish (nats.py:
# 30 s); what is left unacked is delivered again to whoever takes over. Seen in CI: a
# detector took over 20 s to stop after SIGTERM.
DRAIN_TIMEOUT_SECONDS = 5

# Pings unanswered after which the connection counts as dead (the ping interval is the
# nats_ping_seconds setting): a half-open connection is found in 3 intervals.
MAX_OUTSTANDING_PINGS = 2

# Refusals of the first connection (0.2 s apart) after which a server is taken to mean it.
_REFUSALS = 5

# How long creating a stream or bucket waits for JetStream on a cluster that is electing
# its leaders (a cluster just started, or one that lost a server).
JETSTREAM_WAIT_SECONDS = 30.0

# Tries at binding a durable consumer another instance may be creating at the same time.
_BIND_ATTEMPTS = 5

log = logging.getLogger("resurge.runtime.bus")

Handler = Callable[[Any], Awaitable[None]]


def stream_of_subject(subject: str) -> Stream:
    """The stream that stores ``subject`` (a subject or filter of one family; a raw one
    by its kind token: a fault-grade kind's stream, else the telemetry stream)."""
    tokens = subject.split(".")
    kind = tokens[4] if tokens[2] == "raw" and len(tokens) > 4 else "*"
    return stream_of(tokens[2], None if kind in ("*", ">") else (kind,))


JOBS_BUCKET = "jobs"
# Where each launch agent records the last command it handled (command_inbox).
AGENT_POSITIONS_BUCKET = "agent_positions"
# The allocation ledger (resurge.control.state.allocations): placements decided, not yet in a
# job record. Made by the first placer that needs it, so other roles need no grant.
ALLOCATIONS_BUCKET = "allocations"
# Each node's faults across jobs, its score and quarantine (resurge.control.state.node_health):
# made by the restarter, which keeps it; viewers read it, an operator's uncordon writes it.
NODE_HEALTH_BUCKET = "node_health"
_NAK_DELAY_SECONDS = 1.0

# When a durable consumer's unacked message is delivered again: after 2 s, then 4, 8,
# 16, then every 30 s (``max_deliver`` in all). A message delivered to a member of the
# queue group whose link has just been partitioned (its socket dead, the server's side
# still open) is lost on the way; with one fixed 30 s ack wait it came again only 30 s
# later, to a member chosen at random, so a fault waited 60 s in a CI run. While a
# handler runs, the bus tells the server every HANDLER_ALIVE_SECONDS that it is still
# at work (``in_progress``), so a slow handler's message is not delivered twice.
REDELIVER_AFTER_SECONDS: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0, 30.0)
HANDLER_ALIVE_SECONDS = 1.0
_DELIVER = {
    "all": DeliverPolicy.ALL,
    "new": DeliverPolicy.NEW,
    "last_per_subject": DeliverPolicy.LAST_PER_SUBJECT,
}


class TransientError(Exception):
    """A handler could not finish now; the message is redelivered after a delay."""


class PermanentError(Exception):
    """A handler can never use this message; it is dead-lettered and not redelivered."""


@dataclass
class _Consumer:
    subject: str
    durable: str
    expects: tuple[type[Envelope], ...]
    handler: Handler
    kind_token: int | None = None
    dead_letters: bool = True


class _StillHandling:
    """Tells the server every HANDLER_ALIVE_SECONDS that ``msg`` is still being handled
    (``in_progress``: its redelivery wait starts again), until :meth:`stop`. A timer, not
    a task per message: most handlers finish long before the first tick."""

    def __init__(self, msg: Msg) -> None:
        self._msg = msg
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(HANDLER_ALIVE_SECONDS, self._tick)
        self._told: set[asyncio.Task[None]] = set()

    def _tick(self) -> None:
        told = self._loop.create_task(self._tell())
        self._told.add(told)
        told.add_done_callback(self._told.discard)
        self._timer = self._loop.call_later(HANDLER_ALIVE_SECONDS, self._tick)

    async def _tell(self) -> None:
        try:
            await self._msg.in_progress()
        except Exception as error:  # a broken link: the message comes again, as unacked
            log.debug("could not say a message is still being handled: %s", error)

    def stop(self) -> None:
        self._timer.cancel()


async def _skip_bad(msg: Msg, reason: DeadLetterReason, detail: str) -> None:
    """Leave a bad message to the consumer that dead-letters it."""


class BatchReader:
    """The batching of :meth:`Bus.consume_batches`, apart from the subscription.

    :meth:`on_message` is the subscription's callback (nats.py calls it for one message
    at a time). Each message is decoded and kept; the list is handed to ``handler``,
    then its last message acked (ack-all), as soon as ``waiting()`` (the messages
    already in the subscription, not yet given to the callback) is 0, or the list
    holds ``batch`` messages. There is no timer and no batch window: an event on a
    quiet bus is handled within the call that received it, and under load the lists
    fill with whatever arrived meanwhile (the subscription keeps receiving while the
    handler runs), up to ``batch``. ``flushes`` counts the lists handed over.

    Every ``yield_every`` messages kept without a hand-over, the reader lets the event
    loop run other tasks: nats.py calls it back to back while its subscription holds
    messages, so a deep backlog would otherwise hold the loop for a whole list of
    decodes, and other consumers of the process (a service's urgent ones) would wait.
    """

    def __init__(
        self,
        handler: Callable[[list[Event]], Awaitable[None]],
        waiting: Callable[[], int],
        *,
        batch: int,
        decode: Callable[[Msg], tuple[Event | None, tuple[DeadLetterReason, str] | None]],
        dead_letter: Callable[[Msg, DeadLetterReason, str], Awaitable[None]],
        outcomes: Counter,
        backlog: Any,
        batches: Any,
        yield_every: int = 32,
    ) -> None:
        self.handler = handler
        self.waiting = waiting
        self.batch = batch
        self.yield_every = yield_every
        self.decode = decode
        self.dead_letter = dead_letter
        self.outcomes = outcomes
        self.backlog = backlog
        self.batches = batches
        self.flushes = 0
        self._events: list[Event] = []
        self._last: Msg | None = None
        self._held = 0

    async def on_message(self, msg: Msg) -> None:
        """Keep one message; hand the list over if nothing else is waiting or it is full."""
        event, problem = self.decode(msg)
        if problem is not None:
            await self.dead_letter(msg, *problem)
        elif event is not None:
            self._events.append(event)
        self._last = msg
        self._held += 1
        waiting = self.waiting()
        if waiting == 0 or self._held >= self.batch:
            self.backlog.set(waiting)
            await self.flush()
        elif self._held % self.yield_every == 0:
            await asyncio.sleep(0)  # let the loop's other tasks run (see the docstring)

    async def flush(self) -> None:
        """Hand the kept events over, then ack the last message (all of them)."""
        msg, events = self._last, self._events
        if msg is None:
            return
        self._last, self._events, self._held = None, [], 0
        self.flushes += 1
        self.batches.inc()
        if events:
            try:
                await self.handler(events)
            except Exception:  # not acked: the list comes again after ack_wait
                log.exception("handling a batch of %d events failed", len(events))
                self.outcomes.labels("retried").inc(len(events))
                return
        self.outcomes.labels("handled").inc(len(events))
        await msg.ack()


class Bus:
    """One service's connection to NATS: publishing, consuming with dead letters, streams."""

    def __init__(
        self, nc: Client, settings: Settings, service: str, registry: CollectorRegistry
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.settings = settings
        self.subjects: Subjects = settings.subjects
        self.service = service
        self.registry = registry  # the service's metrics: the cluster backend adds its own
        self.source = Source.here(service)
        self.dead_letters = DeadLetterOffice(service, self.subjects, registry, self.publish)
        self._handled = Counter(
            "resurge_messages_total",
            "Messages consumed, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self._backlog = Gauge(
            "resurge_batch_consumer_backlog_messages",
            "Messages a batch consumer had waiting in its subscription when it last handed a "
            "list over (at most its max_ack_pending; the rest waits in the stream).",
            ["consumer"],
            registry=registry,
        )
        self._batches = Counter(
            "resurge_batch_consumer_batches_total",
            "Lists a batch consumer handed over (events handled / lists: the mean list size).",
            ["consumer"],
            registry=registry,
        )
        self._subscriptions: list[Any] = []
        self._listeners: list[Callable[[bool], None]] = []
        self._renewal: asyncio.Task[None] | None = None  # of an expiring user JWT

    def on_connection_change(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(False)`` whenever the connection goes down and
        ``listener(True)`` whenever it is back (from the event loop, at once)."""
        self._listeners.append(listener)

    def _connection_changed(self, connected: bool) -> None:
        for listener in list(self._listeners):
            try:
                listener(connected)
            except Exception:
                log.exception("a connection listener failed")

    @classmethod
    async def connect(
        cls,
        settings: Settings,
        service: str,
        registry: CollectorRegistry | None = None,
        connect_timeout: float | None = None,
    ) -> Bus:
        """Connect, retrying the first connection for up to ``connect_timeout`` seconds
        (default: the ``connect_timeout_seconds`` setting)."""
        connect_timeout = connect_timeout or settings.connect_timeout_seconds

        errors = RateLimitedLog(log, interval=30.0)
        refused = asyncio.Event()
        refusals = 0
        changes = _ConnectionChanges()

        async def on_error(error: Exception) -> None:
            nonlocal refusals
            if _is_refusal(error) and not nc.is_connected:
                refusals += 1  # a server reloading its users may refuse a new one briefly
                if refusals >= _REFUSALS:
                    refused.set()
            errors.warning(type(error).__name__, f"nats error: {error}")

        try:
            auth = connect_options(settings)
        except (CredentialsError, OSError, ssl.SSLError) as error:
            raise ConnectionError(f"cannot connect to nats: {error}") from error
        nc = changes.nc = Client()
        # nats.py retries the first connection as it retries reconnects (forever here),
        # so the deadline is kept from outside, and so is giving up on a refusing server.
        connecting = asyncio.ensure_future(
            nc.connect(
                servers=settings.nats_url.split(","),
                name=f"{settings.namespace}-{service}",
                error_cb=on_error,
                disconnected_cb=changes.disconnected,
                reconnected_cb=changes.reconnected,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.2,  # type: ignore[arg-type]  # typed int, takes float
                connect_timeout=2,
                ping_interval=settings.nats_ping_seconds,  # type: ignore[arg-type]  # a float
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                allow_reconnect=True,
                drain_timeout=DRAIN_TIMEOUT_SECONDS,
                **auth,
            ),
        )
        if await _connected(connecting, refused, connect_timeout):
            bus = changes.bus = cls(nc, settings, service, registry or CollectorRegistry())
            credentials = auth.get("user_credentials")
            if isinstance(credentials, UserString):  # a .creds text: its JWT may expire
                renewal = keep_user_fresh(nc, bus.subjects, credentials)
                bus._renewal = asyncio.create_task(renewal, name="user-jwt-renewal")
            return bus
        await nc.close()
        if refused.is_set():
            raise ConnectionError(
                f"nats at {settings.nats_url} refused the connection: {_who(auth)}"
            )
        raise ConnectionError(
            f"cannot reach nats at {settings.nats_url} within {connect_timeout} s"
        )

    @property
    def connected(self) -> bool:
        """Whether the NATS connection is up now."""
        return bool(self.nc.is_connected)

    async def ensure_streams(self, update: bool = True) -> None:
        """Create or update every stream and the job-record bucket; safe to repeat.

        ``update`` False: only create what is missing, reading (never changing) what
        exists, for parties whose user may not manage streams (agents, viewers)."""
        if not update:
            await self._create_missing()
            return
        # In table order: the telemetry stream of a deployment from before the raw
        # family was split gives up the fault-grade subjects before their stream is made.
        for one in STREAMS:
            max_age = (
                self.settings.raw_max_age_seconds
                if one.short_retention
                else self.settings.stream_max_age_seconds
            )
            config = StreamConfig(
                name=self.subjects.stream(one.name),
                subjects=self.stream_subjects(one),
                storage=StorageType.FILE,
                max_age=max_age,
                duplicate_window=min(120.0, max_age),
                num_replicas=self.settings.stream_replicas,
                allow_direct=one.name == "cmd",
            )
            await until_jetstream(partial(self._add_or_update, config))
        await self.create_bucket(JOBS_BUCKET, history=5)
        # A position is of no use once the commands it points into have aged out.
        await self.create_bucket(
            AGENT_POSITIONS_BUCKET, ttl=self.settings.stream_max_age_seconds, direct=True
        )

    def stream_subjects(self, one: Stream) -> list[str]:
        """The subjects ``one`` stores: its family's, or those of its kinds."""
        if not one.kinds:
            return [self.subjects.all(one.family)]
        return [self.subjects.raw(None, kind, None) for kind in one.kinds]

    async def _add_or_update(self, config: StreamConfig) -> None:
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError as error:
            # Only "exists with another configuration" is a stream to update; another
            # 400 (no peers for its copies yet, while a cluster forms) is raised as it is.
            if error.err_code != _STREAM_EXISTS_OTHERWISE:
                raise
            await self.js.update_stream(config)

    async def create_bucket(self, name: str, history: int = 1, **options: Any) -> KeyValue:
        """Create (or bind, if it exists alike) KV bucket ``name`` of this namespace, with
        the ``stream_replicas`` setting's copies."""
        config = KeyValueConfig(
            bucket=self.subjects.kv_bucket(name),
            history=history,
            replicas=self.settings.stream_replicas,
            **options,
        )
        return await until_jetstream(lambda: self.js.create_key_value(config))

    async def _create_missing(self) -> None:
        for one in STREAMS:
            try:
                name = self.subjects.stream(one.name)
                await until_jetstream(partial(self.js.stream_info, name))
            except nats.js.errors.NotFoundError:
                await self.ensure_streams()
                return
        for bucket in (JOBS_BUCKET, AGENT_POSITIONS_BUCKET):
            try:
                await self.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                await self.ensure_streams()
                return

    async def key_value(self, bucket: str) -> KeyValue:
        """Bind KV bucket ``bucket`` (its name in the namespace), asked again while
        JetStream does not answer (:func:`until_jetstream`); BucketNotFoundError where
        it does not exist."""
        name = self.subjects.kv_bucket(bucket)
        return await until_jetstream(lambda: self.js.key_value(name))

    async def jobs_bucket(self) -> KeyValue:
        """The KV bucket of job records (``<namespace>_jobs``)."""
        return await self.key_value(JOBS_BUCKET)

    async def allocations_bucket(self, create: bool = True) -> KeyValue | None:
        """The allocation ledger's bucket (``<namespace>_allocations``), created if
        missing and ``create`` (placers); None if missing and not ``create`` (viewers)."""
        try:
            return await self.key_value(ALLOCATIONS_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            if not create:
                return None
        return await self.create_bucket(ALLOCATIONS_BUCKET, history=1)

    async def node_health_bucket(self, create: bool = True) -> KeyValue | None:
        """The node health records' bucket (``<namespace>_node_health``), created if
        missing and ``create`` (the restarter); None if missing and not ``create``."""
        try:
            return await self.key_value(NODE_HEALTH_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            if not create:
                return None
        return await self.create_bucket(NODE_HEALTH_BUCKET, history=1)

    async def publish(self, subject: str, event: Envelope) -> None:
        """Store ``event`` in its stream and wait for the server's ack."""
        await self.js.publish(subject, encode_event(event), headers={"Nats-Msg-Id": event.id})

    async def publish_nowait(self, subject: str, event: Envelope) -> None:
        """Send ``event`` once, without waiting for the stream's ack (it is still stored).

        No ``Nats-Msg-Id``: it is sent once and never again, so the stream has nothing
        to de-duplicate; the header would cost the server an entry in its duplicate
        window per message and every consumer the parsing of headers (nats.py), about a
        third of a telemetry reader's time. The event id stays in the body."""
        await self.nc.publish(subject, encode_event(event))

    async def consume(
        self,
        subject: str,
        durable: str,
        handler: Handler,
        *,
        expects: tuple[type[Envelope], ...] = (),
        start: Literal["all", "new", "last_per_subject"] = "all",
        redeliver_after: tuple[float, ...] = REDELIVER_AFTER_SECONDS,
        max_deliver: int = 10,
        kind_token: int | None = None,
        inactive_seconds: float | None = None,
        stream: str | None = None,
        dead_letters: bool = True,
    ) -> None:
        """Bind durable consumer ``durable`` on ``subject`` and feed ``handler``.

        ``expects`` lists the kinds the handler takes (empty: any). ``start`` is where a
        new consumer begins: every stored message, only new ones, or the newest message
        of each subject (an already existing consumer goes on where it stopped). Instances of one
        service that use the same ``durable`` share the messages (a queue group).
        ``kind_token`` names the subject token that must equal the event's kind (4 for
        ``raw`` subjects); a message of another kind there is dead-lettered.
        ``inactive_seconds``: the server deletes the consumer after that long unbound.
        ``stream``: the name of the stream it reads (None: the one storing ``subject``,
        :func:`stream_of_subject`). ``redeliver_after``: the waits before each delivery
        again of an unacked message (the last repeats), up to ``max_deliver`` deliveries;
        an existing consumer with other waits is updated to these. ``dead_letters``
        False ends bad messages without dead-lettering them, for a consumer whose messages
        another consumer of the service also reads and dead-letters (each bad message is
        dead-lettered and counted once).
        """
        if len(redeliver_after) >= max_deliver or min(redeliver_after) <= HANDLER_ALIVE_SECONDS:
            raise ValueError(
                f"{durable}: redeliver_after {redeliver_after} needs fewer waits than "
                f"max_deliver ({max_deliver}), each over {HANDLER_ALIVE_SECONDS} s"
            )
        consumer = _Consumer(subject, durable, expects, handler, kind_token, dead_letters)
        config = ConsumerConfig(
            name=durable,  # named, the filter is in the create request's subject (below)
            ack_wait=redeliver_after[0],
            backoff=list(redeliver_after),
            max_deliver=max_deliver,
            deliver_policy=_DELIVER[start],
            filter_subject=subject,
            inactive_threshold=inactive_seconds,
        )

        async def on_message(msg: Msg) -> None:
            await self._deliver(consumer, msg)

        sub = await self._bind(subject, durable, on_message, config, stream=stream)
        await self._update_redelivery(sub, config)

    async def _update_redelivery(self, sub: Any, wanted: ConsumerConfig) -> None:
        """Give a consumer made before with other redelivery waits (an older release:
        one 30 s ack wait) the ones of ``wanted``; binding does not change an existing
        consumer's config."""
        info = await sub.consumer_info()
        if info.config.backoff == wanted.backoff and info.config.ack_wait == wanted.ack_wait:
            return
        updated = info.config.evolve(ack_wait=wanted.ack_wait, backoff=wanted.backoff)
        await self.js.add_consumer(info.stream_name, config=updated)
        log.info("consumer %s: redelivery after %s s now", info.name, wanted.backoff)

    async def _bind(
        self,
        subject: str,
        durable: str,
        on_message: Callable[[Msg], Awaitable[None]],
        config: ConsumerConfig,
        stream: str | None = None,
        **options: Any,
    ) -> Any:
        """Bind durable push consumer ``durable`` (a queue group of that name).

        The consumer is created by name, so the create request's subject ends in its
        filter (``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``), which NATS
        permissions can allow or deny per filter (docs/security.md).

        Two instances binding a new consumer at once both find it missing and both create
        it, each with its own deliver subject; the server refuses the second (a
        BadRequestError). Binding again then finds the consumer and joins its group.
        """
        for attempt in range(_BIND_ATTEMPTS):
            try:
                sub = await self.js.subscribe(
                    subject,
                    queue=durable,
                    durable=durable,
                    stream=self.subjects.stream(stream or stream_of_subject(subject).name),
                    cb=on_message,
                    manual_ack=True,
                    config=config,
                    **options,
                )
            except nats.js.errors.BadRequestError:
                if attempt == _BIND_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            self._subscriptions.append(sub)
            return sub
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def consume_batches(
        self,
        subject: str,
        durable: str,
        handler: Callable[[list[Event]], Awaitable[None]],
        *,
        kind_token: int | None = None,
        batch: int = 500,
        ack_wait_seconds: float = 30.0,
        dead_letters: bool = True,
        start: Literal["all", "new"] = "all",
        stream: str | None = None,
    ) -> None:
        """Read a high-rate stream in batches (telemetry): decode, check, hand over a list.

        ``start`` is where a new consumer begins (every stored message or only new ones),
        and ``stream`` the stream it reads, as for :meth:`consume`.

        ``dead_letters`` False skips bad messages without dead-lettering them, for a
        consumer whose messages another consumer of the service also reads and
        dead-letters (so each bad message is dead-lettered and counted once).

        A durable push consumer with ack-all: events are handed to ``handler`` in lists of
        up to ``batch``, and one ack after the handler returned covers the list, so a list
        is redelivered if the service dies mid-way. Bad messages are dead-lettered as in
        :meth:`consume`.

        A list is handed over as soon as no further message is waiting in the
        subscription (or it is full): nothing waits for more to arrive, so a lone event
        on a quiet bus is handled at once, and under load the lists grow by themselves
        with whatever arrived while the previous one was handled (see
        :class:`BatchReader`). Bounds: the server has at most ``batch * 20`` messages
        unacked (``max_ack_pending``), so the subscription never buffers more than that;
        the rest waits in the stream (backpressure, nothing dropped).
        """
        config = ConsumerConfig(
            name=durable,
            ack_policy=AckPolicy.ALL,
            ack_wait=ack_wait_seconds,
            max_ack_pending=batch * 20,
            deliver_policy=_DELIVER[start],
            filter_subject=subject,
        )
        subscribed: list[Any] = []

        def waiting() -> int:  # before the subscription is known: nothing assumed waiting
            return int(subscribed[0].pending_msgs) if subscribed else 0

        reader = BatchReader(
            handler,
            waiting,
            batch=batch,
            decode=lambda msg: _decode_checked(msg, kind_token),
            dead_letter=self._dead_letter if dead_letters else _skip_bad,
            outcomes=self._handled,
            backlog=self._backlog.labels(durable),
            batches=self._batches.labels(durable),
        )
        subscribed.append(
            await self._bind(
                subject, durable, reader.on_message, config, stream, pending_msgs_limit=batch * 40
            )
        )

    async def _check(self, msg: Msg, kind_token: int | None) -> Event | None:
        """The decoded event, or None after dead-lettering it (without acking it)."""
        event, problem = _decode_checked(msg, kind_token)
        if problem is not None:
            await self._dead_letter(msg, *problem)
        return event

    async def _dead_letter(self, msg: Msg, reason: DeadLetterReason, detail: str) -> None:
        self._handled.labels("dead_lettered").inc()
        await self.dead_letters.send(msg.subject, msg.data, reason, detail)

    async def subscribe(
        self, subject: str, handler: Callable[[Event, str], Awaitable[None]]
    ) -> Any:
        """Core-NATS subscription (no stream, no ack), for watchers such as the CLI.

        ``handler`` gets each decoded event and the subject it arrived on.
        """

        async def on_message(msg: Msg) -> None:
            event, problem = _decode_checked(msg, None)
            if problem is not None:
                await self.dead_letters.send(msg.subject, msg.data, *problem)
                return
            assert event is not None
            await handler(event, msg.subject)

        sub = await self.nc.subscribe(subject, cb=on_message)
        self._subscriptions.append(sub)
        return sub

    async def bind(
        self,
        entry: Subscription,
        handler: Callable[..., Awaitable[None]],
        scope: Scope | None = None,
        **options: Any,
    ) -> list[Any]:
        """Bind declared subscription ``entry`` (:mod:`resurge.contract.subscriptions`)
        with its subject, stream, consumer name, start and kinds, ``scope`` filling its
        open tokens. ``handler`` is what the entry's reader hands over (:meth:`consume`:
        an event; :meth:`consume_batches`: a list; :meth:`subscribe`: an event and its
        subject); ``options`` go to that method. Returns the core subscriptions made
        (those of watching readers), to unsubscribe. A command inbox is made with
        ``CommandInbox.declared`` instead."""
        made: list[Any] = []
        for one in entry.scopes(scope):
            subject, name = entry.subject(self.subjects, one), entry.consumer(one)
            if entry.reader is Reader.DURABLE:
                expects = tuple(EVENT_KINDS[k] for k in entry.kinds)
                await self.consume(
                    subject, name, handler, expects=expects, start=entry.start,
                    stream=entry.stream, dead_letters=entry.dead_letters, **options,
                )  # fmt: skip
            elif entry.reader is Reader.BATCHES:
                if entry.start == "last_per_subject":
                    raise ValueError(f"{entry.name}: batches start at all or new messages")
                await self.consume_batches(
                    subject, name, handler, kind_token=RAW_KIND_TOKEN,
                    dead_letters=entry.dead_letters, start=entry.start, stream=entry.stream,
                    **options,
                )  # fmt: skip
            elif entry.reader is Reader.WATCH:
                made.append(await self.subscribe(subject, handler))
            else:
                what = f"{entry.service}/{entry.name}"
                raise ValueError(f"{what}: a {entry.reader} reader is not bound here")
        return made

    async def _deliver(self, consumer: _Consumer, msg: Msg) -> None:
        if consumer.dead_letters:
            event = await self._check(msg, consumer.kind_token)
        else:
            event, _ = _decode_checked(msg, consumer.kind_token)
        if event is None:
            await msg.term()
            return
        if consumer.expects and not isinstance(event, consumer.expects):
            if not consumer.dead_letters:
                await msg.term()
                return
            wanted = ", ".join(sorted(m.model_fields["kind"].default for m in consumer.expects))
            await self._reject(
                msg,
                DeadLetterReason.UNEXPECTED_KIND,
                f"kind {event.kind!r} on {msg.subject}; this consumer takes {wanted}",
            )
            return
        alive = _StillHandling(msg)
        try:
            await consumer.handler(event)
        except PermanentError as error:
            await self._reject(msg, DeadLetterReason.INVALID, str(error))
            return
        except Exception as error:
            transient = isinstance(error, TransientError)
            log.log(
                logging.WARNING if transient else logging.ERROR,
                "handling %s failed, will retry: %s",
                event.kind,
                error,
                exc_info=not transient,
                extra={"event_id": event.id, "kind": event.kind, "job": event.job},
            )
            self._handled.labels("retried").inc()
            await msg.nak(delay=_NAK_DELAY_SECONDS)
            return
        finally:
            alive.stop()
        self._handled.labels("handled").inc()
        await msg.ack()

    async def _reject(self, msg: Msg, reason: DeadLetterReason, detail: str) -> None:
        try:
            await self._dead_letter(msg, reason, detail)
        finally:
            await msg.term()

    async def close(self) -> None:
        """Drain subscriptions and pending publishes, then close; a connection that is
        reconnecting (its server gone) has nothing to drain into, and is just closed, as is
        one the server resets or stops answering while it drains (what was pending is
        lost, and logged)."""
        if self._renewal is not None:
            self._renewal.cancel()
        if self.nc.is_closed:
            return
        already = (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError)
        try:
            with contextlib.suppress(*already):
                await self.nc.drain()
        except nats.errors.ConnectionReconnectingError:
            await self._close_broken()
        except ConnectionError as error:  # reset mid-drain: a stop is no start-up failure
            log.warning("the NATS connection broke while draining (%s); closing it", error)
            await self._close_broken()
        except nats.errors.TimeoutError:  # the server stopped answering mid-drain
            log.warning("the NATS server did not answer the drain's flush; closing it")
            await self._close_broken()

    async def _close_broken(self) -> None:
        """Close a connection whose server is gone: its own flush on the way out may
        fail again ("Connection lost"), which a stop does not report as a failure."""
        try:
            await self.nc.close()
        except (ConnectionError, OSError, nats.errors.Error) as error:
            log.warning("closing the broken NATS connection failed too (%s)", error)


class _ConnectionChanges:
    """nats.py's disconnected and reconnected callbacks: each change is logged, and
    told to the bus's listeners once the bus exists."""

    def __init__(self) -> None:
        self.nc: Client | None = None
        self.bus: Bus | None = None

    async def disconnected(self) -> None:
        nc = self.nc
        if nc is None or nc.is_closed or nc.is_draining:
            return
        log.warning("disconnected from nats")
        if self.bus is not None:
            self.bus._connection_changed(False)

    async def reconnected(self) -> None:
        nc = self.nc
        log.info("reconnected to nats at %s", nc.connected_url if nc else None)
        if nc is not None:
            renewed = await _renew_ordered_consumers(nc)
            if renewed:
                log.info("created %d ordered consumer(s) (KV watches) again", renewed)
        if self.bus is not None:
            self.bus._connection_changed(True)


async def _renew_ordered_consumers(nc: Client) -> int:
    """Have every ordered consumer of ``nc`` created again, from the stream sequence
    after the last message it delivered; how many. A restarted server lost them (they
    are kept in memory), and a consumer that still exists is left to expire (its
    inactive threshold) while the new one takes over, so nothing is lost or repeated.

    This is what nats.py itself does when it notices missed heartbeats
    (``reset_ordered_consumer``), done at once; it reads nats.py's own fields, and
    where a version lacks them it does nothing (nats.py's heartbeat check remains)."""
    renewed = 0
    for sub in list(getattr(nc, "_subs", {}).values()):
        jsi = getattr(sub, "_jsi", None)
        if jsi is None or not getattr(jsi, "_ordered", False) or not hasattr(jsi, "_sseq"):
            continue
        try:
            await jsi.reset_ordered_consumer(jsi._sseq + 1)
        except Exception as error:  # never fail the reconnect: the heartbeat check remains
            log.warning("could not create an ordered consumer again: %r", error)
        else:
            renewed += 1
    return renewed


T = TypeVar("T")


async def until_jetstream(
    request: Callable[[], Awaitable[T]], wait_seconds: float = JETSTREAM_WAIT_SECONDS
) -> T:
    """``request()``, asked again while JetStream is not available yet: a NATS cluster
    that just started (or lost a server) elects its JetStream leaders first."""
    deadline = asyncio.get_running_loop().time() + wait_seconds
    while True:
        try:
            return await request()
        except (nats.js.errors.APIError, nats.errors.TimeoutError) as error:
            if not _electing(error) or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.25)  # a leader election: nothing to await but the retry


# JetStream's answer to adding a stream that exists with another configuration.
_STREAM_EXISTS_OTHERWISE = 10058

# JetStream's answers while a cluster forms or elects: no peers for a replicated
# stream yet (10005), no leader yet (503).
_ELECTING_CODES = frozenset({10005})


def _electing(error: Exception) -> bool:
    """Whether ``error`` says JetStream is electing its leaders (so: ask again)."""
    if isinstance(error, (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError)):
        return True
    return isinstance(error, nats.js.errors.APIError) and error.err_code in _ELECTING_CODES


async def _connected(
    connecting: asyncio.Future[None], refused: asyncio.Event, wait_seconds: float
) -> bool:
    """Wait for ``connecting`` until ``refused`` is set or ``wait_seconds`` pass; True once
    connected, else False with the attempt stopped."""
    refusing = asyncio.ensure_future(refused.wait())
    try:
        await asyncio.wait(
            (connecting, refusing), timeout=wait_seconds, return_when="FIRST_COMPLETED"
        )
    except BaseException:  # cancelled: stop trying
        connecting.cancel()
        raise
    finally:
        refusing.cancel()
    if connecting.done() and connecting.exception() is None:
        return True
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await connecting
    return False


def _is_refusal(error: Exception) -> bool:
    """Whether the server refused the connection's user (nats.py reports it as a plain
    Error naming it, or as AuthorizationError)."""
    if isinstance(error, nats.errors.AuthorizationError):
        return True
    return "authorization violation" in str(error).lower()


def _who(options: dict[str, Any]) -> str:
    """Whom a refused connection tried to be, in words."""
    if "user_credentials" in options:
        named = str(options["inbox_prefix"]).removeprefix("_INBOX_")
        return (
            f"its user JWT (user {named!r}) was not accepted: expired, or not signed by a "
            "key of an account the server trusts"
        )
    user = options.get("user")
    if user is None:
        return (
            "it needs a user (set RESURGE_NATS_CREDENTIALS, RESURGE_NATS_CREDS, or "
            "RESURGE_NATS_USER and RESURGE_NATS_PASSWORD)"
        )
    return f"user {user!r} and its password were not accepted"


def _decode_checked(
    msg: Msg, kind_token: int | None
) -> tuple[Event | None, tuple[DeadLetterReason, str] | None]:
    """The event in ``msg``, or why it cannot be used (a synchronous hot path): it does
    not decode, its kind is not its subject's, or (a raw event) its body names another job
    or node than its subject, which is what publish permissions vouch for."""
    try:
        event = decode_event(msg.data)
    except DecodeError as error:
        return None, (error.reason, error.detail)
    mismatch = raw_subject_mismatch(msg.subject, event.job, event.node)
    if mismatch is not None:
        detail = f"{event.kind} on {msg.subject}: {mismatch}"
        return None, (DeadLetterReason.SUBJECT_MISMATCH, detail)
    if kind_token is not None:
        tokens = msg.subject.split(".")
        on_subject = tokens[kind_token] if len(tokens) > kind_token else ""
        if on_subject != event.kind:
            detail = f"kind {event.kind!r} on {msg.subject}, whose kind token is {on_subject!r}"
            return None, (DeadLetterReason.UNEXPECTED_KIND, detail)
    return event, None
