"""The detector service: raw events in, faults, finished replicas and capacity out.

One durable consumer reads every raw subject (checking each event's kind against its
subject); a KV watch keeps the records of the jobs this replica judges, so a changed
job spec (log rules, timeouts) takes effect on the next event; a tick every
``RESURGE_DETECTOR_TICK_SECONDS`` lets detectors judge silences and windows. The
detectors come from the entry-point group ``resurge.detectors`` (``RESURGE_DETECTORS``:
``all`` or a comma-separated list).

Durable detector state lives in the KV bucket ``<namespace>_detector_state``, which this
service owns (keys ``<detector>.<job>.<key>``, each part escaped as one subject token;
entries expire 7 days after their last write). At start, before its consumer reads a
raw event, the service gives the entries of the jobs it judges back to their detectors;
after each batch of raw events (and each tick) it publishes what the detectors
concluded, then writes what their state changed, and only then acks the batch, so a
restart or a failed write redelivers the batch rather than losing a change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import nats.js.errors
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue
from prometheus_client import Counter
from pydantic import Field

from resurge.contract.subjects import RAW_KIND_TOKEN, escape_token, unescape_token
from resurge.control.records import JobRecord
from resurge.detection import available_detectors, load_detectors
from resurge.events import CapacityChanged, Envelope, Event, FaultDetected, ReplicaFinished
from resurge.runtime.kv_keys import bucket_keys
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_detector.runtime import DetectorRuntime, Partition, StateKey

__all__ = ["STATE_BUCKET", "DetectorSettings", "make_setup", "state_entry_key"]

STATE_BUCKET = "detector_state"
_STATE_MAX_AGE_SECONDS = 7 * 24 * 3600.0


def state_entry_key(detector: str, job: str, key: str) -> str:
    """The KV key of one durable state entry."""
    return ".".join(escape_token(part) for part in (detector, job, key))


class DetectorSettings(Settings):
    detectors: str = Field(
        default="all", description="'all' registered detectors, or a comma-separated list."
    )
    detector_replicas: int = Field(default=1, ge=1, description="Detector replicas in all.")
    detector_index: int = Field(default=0, ge=0, description="This replica's index.")
    detector_tick_seconds: float = Field(
        default=0.1, gt=0, description="How often detectors judge silences and windows."
    )

    def detector_names(self) -> list[str]:
        if self.detectors.strip() == "all":
            return sorted(available_detectors())
        return [n.strip() for n in self.detectors.split(",") if n.strip()]


def make_setup(settings: DetectorSettings) -> Callable[[ServiceContext], Awaitable[None]]:
    detectors = load_detectors(settings.detector_names())
    partition = Partition(settings.detector_replicas, settings.detector_index)

    async def setup(ctx: ServiceContext) -> None:
        bus = ctx.bus
        runtime = DetectorRuntime(detectors, bus.source, partition)
        published = Counter(
            "resurge_detector_events_total", "Events concluded, by kind.", ["kind"],
            registry=ctx.registry,
        )  # fmt: skip
        seen = Counter(
            "resurge_detector_raw_events_total", "Raw events read.", registry=ctx.registry
        )
        names = ", ".join(d.name for d in detectors)
        ctx.log.info("detectors: %s; partition %d of %d", names, partition.index,
                     partition.replicas)  # fmt: skip

        async def publish(events: list[Envelope]) -> None:
            for event in events:
                published.labels(event.kind).inc()
                if isinstance(event, FaultDetected) and event.job is not None:
                    ctx.log.warning("fault %s: %s", event.fault_id, event.message,
                                    extra={"job": event.job, "rank": event.rank})  # fmt: skip
                    await bus.publish(bus.subjects.fault(event.job, event.scope.value), event)
                elif isinstance(event, ReplicaFinished) and event.job is not None:
                    await bus.publish(bus.subjects.job(event.job), event)
                elif isinstance(event, CapacityChanged) and event.node is not None:
                    await bus.publish(bus.subjects.capacity(event.node), event)

        state = await bus.js.create_key_value(
            KeyValueConfig(
                bucket=bus.subjects.kv_bucket(STATE_BUCKET),
                history=1,
                ttl=_STATE_MAX_AGE_SECONDS,
            )
        )
        restored = await _restore(state, runtime)
        if restored:
            ctx.log.info("restored %d detector state entries", restored)
        unsaved: dict[StateKey, bytes | None] = {}

        async def save_state() -> None:
            """Write what the detectors' state changed; what fails is retried next time."""
            unsaved.update(runtime.state_changes())
            for where, value in list(unsaved.items()):
                key = state_entry_key(*where)
                if value is None:
                    await state.delete(key)
                else:
                    await state.put(key, value)
                del unsaved[where]

        kv = await bus.jobs_bucket()
        watcher = await kv.watch(">")

        async def follow_jobs() -> None:
            async for entry in watcher:
                if entry is None:
                    continue
                name = unescape_token(entry.key)
                deleted = entry.operation in ("DEL", "PURGE") or not entry.value
                runtime.set_job(
                    name, None if deleted else JobRecord.model_validate_json(entry.value)
                )

        async def tick() -> None:
            while True:
                await asyncio.sleep(settings.detector_tick_seconds)
                await publish(runtime.tick(datetime.now(UTC)))
                try:
                    await save_state()
                except Exception as error:  # the next batch or tick tries again
                    ctx.log.warning("could not save detector state: %r", error)

        async def on_raw(events: list[Event]) -> None:
            now = datetime.now(UTC)
            seen.inc(len(events))
            await publish(runtime.observe_all(events, now))
            await save_state()  # before the batch is acked: a failure redelivers it

        ctx.spawn(follow_jobs())
        ctx.spawn(tick())
        ctx.exit_stack.push_async_callback(watcher.stop)
        durable = "detector" if partition.replicas == 1 else (
            f"detector-{partition.index}-of-{partition.replicas}"
        )  # fmt: skip
        await bus.consume_batches(
            bus.subjects.all("raw"), durable, on_raw, kind_token=RAW_KIND_TOKEN
        )

    return setup


async def _restore(state: KeyValue, runtime: DetectorRuntime) -> int:
    """Hand every stored entry of the jobs this replica judges back to its detector."""
    restored = 0
    for name in await bucket_keys(state):  # not state.keys(): see resurge.runtime.kv_keys
        parts = name.split(".")
        if len(parts) != 3:
            continue
        try:
            entry = await state.get(name)
        except nats.js.errors.KeyNotFoundError:  # deleted or expired meanwhile
            continue
        if entry.value:
            detector, job, key = (unescape_token(part) for part in parts)
            restored += runtime.restore_state(detector, job, key, entry.value)
    return restored
