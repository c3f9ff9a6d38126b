"""The detector's fault lane: a worker's exit is judged while telemetry published before
it still waits to be read, and each event is judged once. Shown by stream positions and
counts, not by timing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import nats.js.errors

from resurge.control.records import JobRecord, JobStore, Placement
from resurge.events import Event, FaultDetected, JobPhase, ProcessExited, Progress, encode_event
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

JOB = "lane-job"
BACKLOG = 30_000  # progress reports published before the exit, read by the main lane


def start_detector(settings: Settings) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_DETECTORS": "process_exit,hang",  # the hang detector reads progress too
    }
    return subprocess.Popen(
        [sys.executable, "-m", "resurge_detector"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def main_lane_read_up_to(bus: Bus) -> int:
    """The stream position the main raw consumer has handled (acked) up to; 0 unbound."""
    try:
        info = await bus.js.consumer_info(bus.subjects.stream("raw"), "detector")
    except nats.js.errors.NotFoundError:
        return 0
    return info.ack_floor.stream_seq if info.ack_floor is not None else 0


async def test_an_exit_is_judged_before_the_telemetry_backlog_ahead_of_it_is_read(
    bus: Bus, settings: Settings
) -> None:
    await JobStore(await bus.jobs_bucket()).create(
        JobRecord(
            name=JOB,
            spec=job(JOB, nproc=2, preload=None),
            phase=JobPhase.RUNNING,
            placements=[Placement(replica=0, node="n0")],
        )
    )
    where = {"source": bus.source, "job": JOB, "replica": 0, "node": "n0", "generation": 0}
    for step in range(BACKLOG):
        report = Progress(rank=0, local_rank=0, step=step, **where)
        await bus.publish_nowait(bus.subjects.raw(JOB, "progress", "n0"), report)
    crash = ProcessExited(rank=1, pid=7, local_rank=1, local_world_size=2, exit_code=1, **where)
    stored = await bus.js.publish(
        bus.subjects.raw(JOB, "process_exited", "n0"),
        encode_event(crash),
        headers={"Nats-Msg-Id": crash.id},
    )
    assert stored.seq > BACKLOG  # every progress report is ahead of the exit in the stream
    faults: list[FaultDetected] = []
    first = asyncio.Event()

    async def on_fault(event: Event, subject: str) -> None:
        if isinstance(event, FaultDetected):  # core NATS: a repeated publish shows too
            faults.append(event)
            first.set()

    await bus.subscribe(bus.subjects.all("fault"), on_fault)
    await bus.nc.flush()
    detector = start_detector(settings)
    try:
        await asyncio.wait_for(first.wait(), 60)
        # The fault is out while most of the telemetry ahead of the exit is unread (the
        # main lane acks a list after handling it: reading the exit there would have
        # acked all but its last list, at most 500 reports, before the fault came).
        assert await main_lane_read_up_to(bus) < BACKLOG // 2
        # The main lane then reads the backlog and the exit, and judges nothing again.
        for _ in range(1200):
            if await main_lane_read_up_to(bus) >= stored.seq:
                break
            await asyncio.sleep(0.1)
        assert await main_lane_read_up_to(bus) >= stored.seq
        await bus.nc.flush()
    finally:
        detector.terminate()
        detector.wait(timeout=20)
    assert [(f.reason, f.rank) for f in faults] == [("process_crash", 1)]
