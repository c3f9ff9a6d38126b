"""The scaler's status writer against a real nats-server's jobs bucket: it goes on past a
job record it cannot read (one written by a newer resurge; that job's status stays as
last written, later records are written), and once stopped (its scaler no longer leads,
on Kubernetes) it tells every job it reported gone, so the job gauges of a standby
scaler show no job."""

from __future__ import annotations

import asyncio
import json

from resurge.cluster.local.backend import LocalBackend
from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import JobPhase
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus
from resurge_scaler.status_writer import StatusWriter


def record(name: str) -> JobRecord:
    return JobRecord(
        name=name,
        spec=job(name),
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=0, node="n0")],
    )


async def test_a_record_of_a_newer_schema_does_not_end_the_status_writer(bus: Bus) -> None:
    store = JobStore(await bus.jobs_bucket())
    backend = await LocalBackend.open(bus)
    newer = json.loads(record("older").model_dump_json())
    newer["phase"] = "Hibernating"
    await store.kv.put(store.key("older"), json.dumps(newer).encode())
    await store.create(record("after"))
    writer = StatusWriter(store.kv, backend)
    task = asyncio.create_task(writer.run())
    try:
        async with asyncio.timeout(20):
            while (await backend.read_job_status("after")) is None:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.05)  # the writer's KV write: polled, bounded
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    status = await backend.read_job_status("after")
    assert status is not None and status["phase"] == "Running"
    assert await backend.read_job_status("older") is None


async def test_a_stopped_status_writer_tells_each_job_it_reported_gone(bus: Bus) -> None:
    store = JobStore(await bus.jobs_bucket())
    backend = await LocalBackend.open(bus)
    await store.create(record("a"))
    await store.create(record("b"))
    told: list[tuple[str, bool]] = []
    both = asyncio.Event()

    def seen(name: str, job_record: JobRecord | None) -> None:
        told.append((name, job_record is not None))
        if {n for n, present in told if present} == {"a", "b"}:
            both.set()

    task = asyncio.create_task(StatusWriter(store.kv, backend, seen).run())
    try:
        await asyncio.wait_for(both.wait(), 20)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    last = {name: present for name, present in told}
    assert last == {"a": False, "b": False}, told
