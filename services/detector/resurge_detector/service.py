"""The detector service: raw events in, faults, finished replicas and capacity out.

Two durable consumers read the raw events (each checking every event's kind against
its subject), one per stream: the fault-grade kinds (process exits, worker fault
reports, agent states, GPU errors) are stored in a stream of their own, so a backlog
of telemetry (GPU samples, progress, log lines) in the other never delays a fault.
Each event reaches its detectors once, from its own stream; nothing a detector
concludes depends on the order of the two streams (a worker's exit carries its last
output lines for the log rules: :mod:`resurge_detector.runtime`). A KV watch
keeps the records of the jobs this replica judges, so a changed job spec (log rules,
timeouts) takes effect on the next event; a tick every
``RESURGE_DETECTOR_TICK_SECONDS`` lets detectors judge silences and windows. The
detectors come from the entry-point group ``resurge.detectors`` (``RESURGE_DETECTORS``:
``all`` or a comma-separated list).

Durable detector state lives in the service's own KV bucket
(:mod:`resurge_detector.state_store`). At start, before its consumer reads a raw event,
the service gives the entries of the jobs it judges back to their detectors; after each
batch of raw events (and each tick) it publishes what the detectors concluded, then
writes what their state changed, and only then acks the batch, so a restart or a
failed write redelivers the batch rather than losing a change.

A concluded event is kept until JetStream acknowledged it: one whose publication
fails (and every one concluded after it, so they keep their order) waits in a queue of
at most :data:`UNPUBLISHED_LIMIT` events and goes out, first, with the next batch's or
tick's conclusions. A detector concludes a fault once (a hang is reported once per
generation), so a publication that failed is never left to a detector to repeat; and a
failed publication still fails its batch, which is not acked. The tick and the job
watch are loops supervised by the runner (:mod:`resurge.runtime.supervision`).

Every time the detectors see (``now`` of each batch and tick) is read from a
:class:`~resurge_detector.connected_clock.ConnectedClock` fed by the bus's connection
changes: it stands still while the detector is cut off from NATS and for a grace after
it is back, so an outage of the bus never counts as workers' silence, and while a batch
waits for its state to be written (its lane reads nothing meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter as Tally
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import nats.js.errors
from nats.js.kv import KeyValue
from prometheus_client import Counter, Gauge, Histogram

from resurge.contract.subjects import unescape_token
from resurge.contract.subscriptions import DETECTOR_FAULTS, DETECTOR_RAW, Scope
from resurge.detection import Detector, load_detectors
from resurge.events import CapacityChanged, Envelope, Event, FaultDetected, ReplicaFinished
from resurge.runtime.kv_keys import bucket_keys
from resurge.runtime.logs import RateLimitedLog
from resurge.runtime.observability import BoundedLabel
from resurge.runtime.service import ServiceContext
from resurge_detector.connected_clock import ConnectedClock
from resurge_detector.runtime import DetectorRuntime, Partition
from resurge_detector.settings import DetectorSettings
from resurge_detector.state_store import StateStore

__all__ = ["UNPUBLISHED_LIMIT", "DetectorService", "make_setup"]

# Raw events judged between two turns of the event loop.
_SLICE = 64

# Concluded events kept while their publication fails (an outage of a minute at a few
# faults a second); past it the oldest is dropped, counted and logged.
UNPUBLISHED_LIMIT = 10_000

# Detection latency buckets (seconds): a fault from an exit or a report comes in well
# under a second; a log rule's or a straggler's may take a window of seconds.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class DetectorService:
    """The detector service's handlers over one bus, one runtime and its state store."""

    def __init__(
        self,
        ctx: ServiceContext,
        settings: DetectorSettings,
        runtime: DetectorRuntime,
        state: StateStore,
        clock: ConnectedClock | None = None,
    ) -> None:
        self.ctx = ctx
        self.bus = ctx.bus
        self.settings = settings
        self.runtime = runtime
        self.state = state
        self.clock = clock or ConnectedClock()
        # ``kind`` (both counters) is bounded: an event kind of the contract's union
        # (a message of any other kind is dead-lettered before it gets here).
        self.published = Counter(
            "resurge_detector_events_total",
            "Events concluded, by kind.",
            ["kind"],
            registry=ctx.registry,
        )
        self.seen = Counter(
            "resurge_detector_raw_events_total",
            "Raw events read, by kind.",
            ["kind"],
            registry=ctx.registry,
        )
        # ``reason`` is bounded by BoundedLabel: plugins name their own reasons.
        self.latency = Histogram(
            "resurge_detection_latency_seconds",
            "From a raw event's time to the fault it led to, by the fault's reason "
            "(faults concluded from the passing of time, such as hangs, are not in it).",
            ["reason"],
            buckets=LATENCY_BUCKETS,
            registry=ctx.registry,
        )
        self.unpublished_events = Gauge(
            "resurge_detector_unpublished_events",
            "Concluded events waiting to be published again (their publication failed).",
            registry=ctx.registry,
        )
        self.unpublished_dropped = Counter(
            "resurge_detector_unpublished_dropped_total",
            f"Concluded events dropped unpublished: more than {UNPUBLISHED_LIMIT} waited.",
            ["kind"],
            registry=ctx.registry,
        )
        self._unpublished: deque[Envelope] = deque()
        self._publishing = asyncio.Lock()
        self._failures = RateLimitedLog(ctx.log, interval=30.0)
        self._reason = BoundedLabel()
        unreadable = Counter(
            "resurge_detector_records_unreadable_total",
            "Job records skipped because they do not validate here (a newer resurge's); "
            "the job's last readable record is kept.",
            registry=ctx.registry,
        )
        runtime.records.on_skip = unreadable.inc
        runtime.on_fault = self._detected

    @classmethod
    async def open(
        cls,
        ctx: ServiceContext,
        settings: DetectorSettings,
        detectors: Sequence[Detector],
        partition: Partition,
    ) -> DetectorService:
        """A service running ``detectors`` for ``partition``, its stored state restored."""
        runtime = DetectorRuntime(detectors, ctx.bus.source, partition)
        names = ", ".join(d.name for d in detectors)
        ctx.log.info(
            "detectors: %s; partition %d of %d", names, partition.index, partition.replicas
        )
        state = await StateStore.open(ctx.bus, runtime)
        # The records first: a restored deadline is judged against its job's record,
        # and a detector's tick drops what belongs to no job it knows.
        jobs = await ctx.bus.jobs_bucket()
        for key in await bucket_keys(jobs):
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):  # deleted meanwhile
                runtime.put_job(unescape_token(key), (await jobs.get(key)).value)
        restored = await state.restore()
        if restored:
            ctx.log.info("restored %d detector state entries", restored)
        return cls(ctx, settings, runtime, state)

    async def start(self) -> None:
        """Follow the job records, tick, and consume the raw subjects."""
        bus = self.bus
        bus.on_connection_change(self._connection_changed)
        watcher = await (await bus.jobs_bucket()).watch(">")
        self.ctx.spawn(partial(self.follow_jobs, watcher), name="follow_jobs")
        self.ctx.spawn(self.tick, name="tick")
        self.ctx.exit_stack.push_async_callback(watcher.stop)
        partition = self.runtime.partition
        if partition.replicas == 1:
            group = Scope(group="detector")
        else:
            group = Scope(group=f"detector-{partition.index}-of-{partition.replicas}")
        await bus.bind(DETECTOR_FAULTS, self.on_raw, group)
        await bus.bind(DETECTOR_RAW, self.on_raw, group)

    def _detected(self, event: Envelope, fault: FaultDetected) -> None:
        seconds = max((fault.time - event.time).total_seconds(), 0.0)
        self.latency.labels(self._reason(fault.reason)).observe(seconds)

    def _connection_changed(self, connected: bool) -> None:
        self.clock.connection_changed(connected)
        if connected:
            self.ctx.log.info(
                "bus back: the detectors' clock runs again in %g s (%.1f s excluded so far)",
                self.clock.grace.total_seconds(),
                self.clock.excluded_seconds,
            )
        else:
            self.ctx.log.warning("bus down: the detectors' clock stands still until it is back")

    async def publish(self, events: list[Envelope]) -> None:
        """Publish what the detectors concluded, after those whose publication failed
        before, in order, each on its subject; an event leaves the queue once JetStream
        acknowledged it. Raises when one fails: it and the rest wait for the next call."""
        queue = self._unpublished
        async with self._publishing:  # one publisher at a time keeps the order
            queue.extend(events)
            while len(queue) > UNPUBLISHED_LIMIT:
                dropped = queue.popleft()
                self.unpublished_dropped.labels(dropped.kind).inc()
                self.ctx.log.error(
                    "dropped unpublished %s %s: too many wait", dropped.kind, dropped.id
                )
            try:
                while queue:
                    await self._publish_one(queue[0])
                    queue.popleft()
            finally:
                self.unpublished_events.set(len(queue))

    async def _publish_one(self, event: Envelope) -> None:
        """One event on its subject (a fault first, then its log line: the restarter's
        decision does not wait for the log)."""
        bus = self.bus
        if isinstance(event, FaultDetected) and event.job is not None:
            await bus.publish(bus.subjects.fault(event.job, event.scope.value), event)
            self.ctx.log.warning(
                "fault %s: %s",
                event.fault_id,
                event.message,
                extra={"job": event.job, "rank": event.rank},
            )
        elif isinstance(event, ReplicaFinished) and event.job is not None:
            await bus.publish(bus.subjects.job(event.job), event)
        elif isinstance(event, CapacityChanged) and event.node is not None:
            await bus.publish(bus.subjects.capacity(event.node), event)
        self.published.labels(event.kind).inc()

    async def follow_jobs(self, watcher: KeyValue.KeyWatcher) -> None:
        """Keep the runtime's job records as the jobs bucket changes (a record this
        version cannot read is skipped, the last one read kept: see ``put_job``)."""
        async for entry in watcher:
            if entry is None:
                continue
            deleted = entry.operation in ("DEL", "PURGE")
            self.runtime.put_job(unescape_token(entry.key), None if deleted else entry.value)

    async def tick(self) -> None:
        """Every tick: the detectors judge silences and windows, what they concluded is
        published (with what waits from before), and their state is saved. A failed
        publication waits for the next tick; the loop goes on."""
        while True:
            await asyncio.sleep(self.settings.detector_tick_seconds)
            try:
                await self.publish(self.runtime.tick(self.clock.now()))
            except Exception as error:  # kept in the queue: the next tick tries again
                self._failures.warning(
                    "tick",
                    f"could not publish what the detectors concluded "
                    f"({len(self._unpublished)} events wait): {error!r}",
                )
                continue
            try:
                await self.state.save()
            except Exception as error:  # the next batch or tick tries again
                self.ctx.log.warning("could not save detector state: %r", error)

    async def on_raw(self, events: list[Event]) -> None:
        """One batch of raw events (of either stream): publish the conclusions, save the
        state, then ack."""
        now = self.clock.now()
        for kind, count in Tally(event.kind for event in events).items():
            self.seen.labels(kind).inc(count)
        # A long list is judged in slices, the loop free between them, so the fault
        # stream's consumer is not held for a whole list of telemetry.
        for start in range(0, len(events), _SLICE):
            if start:
                await asyncio.sleep(0)
            part = events[start : start + _SLICE]
            await self.publish(self.runtime.observe_all(part, now))
        # Before the batch is acked (a failure redelivers it). Events are not heard
        # meanwhile, so the detectors' clock stands still: a long write (a job's new
        # generation rewrites an entry per replica) is no silence of the workers.
        self.clock.hold()
        try:
            await self.state.save()
        finally:
            self.clock.release()


def make_setup(settings: DetectorSettings) -> Callable[[ServiceContext], Awaitable[None]]:
    """The runner's entry for ``settings``. The detectors are loaded now, so an unknown
    name fails before the service starts."""
    detectors = load_detectors(settings.detector_names())
    partition = Partition(settings.detector_replicas, settings.detector_index)

    async def setup(ctx: ServiceContext) -> None:
        service = await DetectorService.open(ctx, settings, detectors, partition)
        await service.start()

    return setup
