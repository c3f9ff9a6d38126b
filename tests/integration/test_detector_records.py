"""A job record the detector cannot read (one written by a newer resurge: a field or a
phase it does not know) does not end its watch of the jobs bucket: it keeps that job's
last readable record, and follows every other job as before."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import Event, FaultDetected, JobPhase, LogLine
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.collect import Events

RULE = {"name": "oom", "logPattern": "out of memory", "faultOnMatch": True}


def record(name: str) -> JobRecord:
    return JobRecord(
        name=name,
        spec=job(name, monitoring={"logRules": [RULE]}),
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=0, node="n0")],
    )


def oom_line(bus: Bus, name: str) -> LogLine:
    return LogLine(
        source=bus.source,
        job=name,
        replica=0,
        node="n0",
        rank=0,
        generation=0,
        local_rank=0,
        stream="stderr",
        line="CUDA out of memory",
    )


async def test_a_record_of_a_newer_schema_is_skipped_and_the_watch_goes_on(
    bus: Bus, settings: Settings
) -> None:
    store = JobStore(await bus.jobs_bucket())
    await store.create(record("older"))
    faults = Events()
    await bus.subscribe(bus.subjects.all("fault"), faults.add)
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_DETECTORS": "log_rules",
    }
    detector = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "resurge_detector", env=env, stderr=subprocess.PIPE
    )
    assert detector.stderr is not None
    said: list[bytes] = []
    try:
        async with asyncio.timeout(30):  # it read the records and follows them
            while b"detector ready" not in (line := await detector.stderr.readline()):
                assert line, "the detector ended"
                said.append(line)
        # A newer resurge rewrites the record with a phase and a field unknown here.
        newer = json.loads(record("older").model_dump_json())
        newer["phase"] = "Hibernating"
        newer["quotaGroup"] = "team-a"
        await store.kv.put(store.key("older"), json.dumps(newer).encode())
        await store.create(record("after"))  # a job submitted after it

        def jobs(items: list[Event]) -> set[str | None]:
            return {f.job for f in items if isinstance(f, FaultDetected)}

        # The watch and the raw consumer are not ordered: a line read before its job's
        # record is ignored, so lines go out until both faults came (each fires once).
        async with asyncio.timeout(30):
            while jobs(faults.items) != {"older", "after"}:
                for name in ("older", "after"):
                    await bus.publish(bus.subjects.raw(name, "log_line", "n0"), oom_line(bus, name))
                with contextlib.suppress(TimeoutError):
                    await faults.wait_for(lambda items: jobs(items) == {"older", "after"}, 0.5)
    finally:
        if detector.returncode is None:
            detector.terminate()
        said += (await detector.communicate())[1].splitlines()
    # It said why it kept the older record, naming what it could not read.
    [warning] = [line for line in said if b"record does not validate" in line]
    assert b"job older" in warning and b"phase" in warning
