"""The detector's tick outlives a failed publish, and the hang fault it concluded while
publishing failed is published once it can be: a detector process, a real server, the
fault stream deleted under it (the publish waits for an ack no stream gives)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator

import pytest
from nats.aio.msg import Msg

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import FaultDetected, JobPhase, ProcessStarted, decode_event
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.collect import Events

JOB = "hung"


class DetectorProcess:
    """``python -m resurge_detector`` with its JSON log lines kept as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, object]] = []
        self.ready = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            entry = json.loads(raw)
            self.lines.append(entry)
            if "detector ready" in str(entry["message"]):
                self.ready.set()

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
        await asyncio.wait_for(self.proc.wait(), 20)
        await self._reader


@pytest.fixture
async def detector(settings: Settings, bus: Bus) -> AsyncIterator[DetectorProcess]:
    spec = job(JOB, nproc=1, monitoring={"startupTimeoutSeconds": 1})
    await JobStore(await bus.jobs_bucket()).create(
        JobRecord(
            name=JOB,
            spec=spec,
            phase=JobPhase.RUNNING,
            placements=[Placement(replica=0, node="n0")],
        )
    )
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_DETECTORS": "hang",
        "RESURGE_DETECTOR_TICK_SECONDS": "0.1",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "resurge_detector", env=env, stderr=asyncio.subprocess.PIPE
    )
    process = DetectorProcess(proc)
    try:
        await asyncio.wait_for(process.ready.wait(), 30)
        yield process
    finally:
        await process.stop()


async def test_a_hang_concluded_while_publishing_fails_is_published_once_it_can_be(
    bus: Bus, detector: DetectorProcess
) -> None:
    faults = bus.subjects.all("fault")
    await bus.js.delete_stream(bus.subjects.stream("fault"))
    attempts = Events()  # the detector's publishes, seen without a stream to store them
    await bus.subscribe(faults, attempts.add)
    await bus.nc.flush()

    started = ProcessStarted(
        source=bus.source,
        job=JOB,
        replica=0,
        node="n0",
        rank=0,
        generation=0,
        pid=4242,
        local_rank=0,
        local_world_size=1,
    )
    await bus.publish(bus.subjects.raw(JOB, "process_started", "n0"), started)
    # No progress for 1 s: the tick concludes the hang and publishes it, in vain.
    await attempts.wait_for(lambda items: any(isinstance(e, FaultDetected) for e in items), 30)

    await bus.ensure_streams()  # the stream is back: the next try is stored
    stored: asyncio.Future[FaultDetected] = asyncio.get_running_loop().create_future()

    async def on_stored(msg: Msg) -> None:
        event = decode_event(msg.data)
        if isinstance(event, FaultDetected) and not stored.done():
            stored.set_result(event)

    sub = await bus.js.subscribe(faults, cb=on_stored, ordered_consumer=True)
    try:
        fault = await asyncio.wait_for(stored, 30)
    finally:
        await sub.unsubscribe()
    assert fault.fault_id == f"hang:{JOB}:g0:r0"
    assert (await bus.js.stream_info(bus.subjects.stream("fault"))).state.messages == 1
    assert any("could not publish" in str(line["message"]) for line in detector.lines)
