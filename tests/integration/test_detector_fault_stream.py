"""The fault-grade raw kinds in a stream of their own: a worker's exit is judged while
the detector's telemetry consumer is stalled with thousands of events waiting, and each
event is judged once. Shown by stream positions and counts, not by timing.

What this proves: the exit is stored apart from the telemetry (its own stream, its own
sequence), and the detector's fault comes from a consumer that no telemetry reaches, so
a telemetry consumer that reads nothing at all (paused in the server) does not hold it
back. A design where one consumer of one stream reads both fails it (the exit waits
behind the paused backlog). The per-kind fault-lane consumers this replaces bypassed
the backlog too; what changed is where the exit is stored, and that no second route
and no de-duplication are needed for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import nats.js.errors

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import (
    Event,
    FaultDetected,
    GpuSample,
    JobPhase,
    LogLine,
    ProcessExited,
    Progress,
    encode_event,
)
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

JOB = "lane-job"
BACKLOG = 6_000  # telemetry published before the exit, waiting for a stalled consumer


def start_detector(settings: Settings) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        # The hang detector reads exits and progress, the log rules exits and lines.
        "RESURGE_DETECTORS": "process_exit,hang,log_rules",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "resurge_detector"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def consumer_exists(bus: Bus, stream: str, name: str) -> bool:
    try:
        await bus.js.consumer_info(bus.subjects.stream(stream), name)
    except nats.js.errors.NotFoundError:
        return False
    return True


def telemetry_event(n: int, where: dict[str, object]) -> Event:
    kind = n % 3
    if kind == 0:
        return Progress(rank=0, local_rank=0, step=n, **where)
    if kind == 1:
        return LogLine(rank=0, local_rank=0, stream="stdout", line=f"step {n}", **where)
    return GpuSample(**{**where, "job": "_"}, gpus=[])


async def test_an_exit_is_judged_while_the_telemetry_consumer_reads_nothing(
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
    faults: list[FaultDetected] = []
    first = asyncio.Event()

    async def on_fault(event: Event, subject: str) -> None:
        if isinstance(event, FaultDetected):  # core NATS: a repeated publish shows too
            faults.append(event)
            first.set()

    await bus.subscribe(bus.subjects.all("fault"), on_fault)
    await bus.nc.flush()
    detector = start_detector(settings)
    telemetry = bus.subjects.stream("raw")
    try:
        for _ in range(1200):  # both consumers bound (another process binds them)
            if await consumer_exists(bus, "raw", "detector") and await consumer_exists(
                bus, "raw-faults", "detector-faults"
            ):
                break
            await asyncio.sleep(0.05)
        # Stall the telemetry consumer: the server delivers it nothing until 2100.
        paused = await bus.nc.request(
            f"$JS.API.CONSUMER.PAUSE.{telemetry}.detector",
            json.dumps({"pause_until": "2100-01-01T00:00:00Z"}).encode(),
            timeout=5,
        )
        assert json.loads(paused.data).get("paused") is True, paused.data
        where: dict[str, object] = {
            "source": bus.source, "job": JOB, "replica": 0, "node": "n0", "generation": 0
        }  # fmt: skip
        for n in range(BACKLOG):
            event = telemetry_event(n, where)
            await bus.publish_nowait(bus.subjects.raw(event.job, event.kind, "n0"), event)
        await bus.nc.flush()
        for _ in range(600):  # stored (a core publish is stored after it is received)
            if (await bus.js.stream_info(telemetry)).state.messages == BACKLOG:
                break
            await asyncio.sleep(0.05)
        crash = ProcessExited(
            rank=1, pid=7, local_rank=1, local_world_size=2, exit_code=1,
            **where,
        )  # fmt: skip
        stored = await bus.js.publish(
            bus.subjects.raw(JOB, "process_exited", "n0"),
            encode_event(crash),
            headers={"Nats-Msg-Id": crash.id},
        )
        assert stored.stream == bus.subjects.stream("raw-faults")  # apart from the telemetry
        assert stored.seq == 1
        info = await bus.js.stream_info(telemetry)
        assert info.state.messages == BACKLOG  # every telemetry event is stored, and waits
        await asyncio.wait_for(first.wait(), 60)
        waiting = await bus.js.consumer_info(telemetry, "detector")
        assert waiting.delivered.stream_seq == 0  # the telemetry consumer read nothing
        assert waiting.num_pending == BACKLOG
        await bus.nc.flush()
    finally:
        detector.terminate()
        detector.wait(timeout=20)
    assert [(f.reason, f.rank) for f in faults] == [("process_crash", 1)]
