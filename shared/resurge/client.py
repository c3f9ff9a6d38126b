"""What the ``resurge`` command does over the bus: submit, delete, status, watch events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import nats.js.errors

from resurge.bus import Bus
from resurge.events import Event, JobDeleted, JobSubmitted, encode_event
from resurge.jobspec import TrainingJob
from resurge.records import JobRecord, JobStore, status_view
from resurge.settings import Settings

__all__ = ["connected", "delete_job", "job_status", "submit_job", "watch_events"]


@asynccontextmanager
async def connected(settings: Settings) -> AsyncIterator[Bus]:
    bus = await Bus.connect(settings, "cli")
    try:
        await bus.ensure_streams()
        yield bus
    finally:
        await bus.close()


async def submit_job(bus: Bus, job: TrainingJob) -> None:
    await bus.publish(
        bus.subjects.job(job.name), JobSubmitted(source=bus.source, job=job.name, spec=job)
    )


async def delete_job(bus: Bus, name: str) -> None:
    await bus.publish(bus.subjects.job(name), JobDeleted(source=bus.source, job=name))


async def job_status(bus: Bus, name: str | None) -> list[dict[str, object]]:
    store = JobStore(await bus.jobs_bucket())
    if name is not None:
        found = await store.get(name)
        return [] if found is None else [status_view(found[0])]
    try:
        keys = await store.kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    views = []
    for key in sorted(keys):
        entry = await store.kv.get(key)
        if entry.value:
            views.append(status_view(JobRecord.model_validate_json(entry.value)))
    return views


async def watch_events(
    bus: Bus, subject: str, on_event: Callable[[Event, str], Awaitable[None]], until: asyncio.Event
) -> None:
    """Feed every event on ``subject`` (core subscription, from now on) until ``until`` is set."""
    sub = await bus.subscribe(subject, on_event)
    try:
        await until.wait()
    finally:
        await sub.unsubscribe()


def event_line(event: Event, as_json: bool) -> str:
    if as_json:
        return encode_event(event).decode()
    context = " ".join(
        f"{key}={value}"
        for key, value in (
            ("job", event.job),
            ("replica", event.replica),
            ("rank", event.rank),
            ("gen", event.generation),
        )
        if value is not None
    )
    body = event.model_dump(
        exclude={
            "id",
            "kind",
            "schema_version",
            "time",
            "source",
            "job",
            "replica",
            "node",
            "rank",
            "generation",
            "spec",
        },
        mode="json",
    )
    return f"{event.time:%H:%M:%S.%f} {event.kind:<17} {context} {json.dumps(body)}"
