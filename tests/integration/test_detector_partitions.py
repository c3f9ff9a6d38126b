"""Two detector replicas share the jobs: each fault is judged by exactly one of them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import Event, FaultDetected, JobPhase, ProcessExited
from resurge.local import job_factory
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from resurge_detector.runtime import Partition

JOBS = [f"job-{i}" for i in range(12)]


def start_replica(settings: Settings, index: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_DETECTOR_REPLICAS": "2",
        "RESURGE_DETECTOR_INDEX": str(index),
        "RESURGE_DETECTORS": "process_exit",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "resurge_detector"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_two_replicas_judge_each_job_once(bus: Bus, settings: Settings) -> None:
    owners = {name: 0 if Partition(2, 0).owns(name) else 1 for name in JOBS}
    assert set(owners.values()) == {0, 1}  # the names spread over both replicas
    store = JobStore(await bus.jobs_bucket())
    for name in JOBS:
        spec = job_factory.job(name, preload=None)
        await store.create(
            JobRecord(
                name=name,
                spec=spec,
                phase=JobPhase.RUNNING,
                placements=[Placement(replica=0, node="n")],
            )
        )
    faults: asyncio.Queue[FaultDetected] = asyncio.Queue()

    async def on_fault(event: Event, subject: str) -> None:
        if isinstance(event, FaultDetected):
            await faults.put(event)

    await bus.subscribe(bus.subjects.all("fault"), on_fault)
    replicas = [start_replica(settings, 0), start_replica(settings, 1)]
    try:
        for name in JOBS:
            crash = ProcessExited(
                source=bus.source,
                job=name,
                replica=0,
                node="n",
                rank=0,
                generation=0,
                pid=1,
                local_rank=0,
                local_world_size=1,
                exit_code=1,
            )
            await bus.publish(bus.subjects.raw(name, "process_exited", "n"), crash)
        got = [await asyncio.wait_for(faults.get(), 30) for _ in JOBS]
        await asyncio.sleep(0.5)  # bounded: any duplicate would have arrived by now
        assert faults.empty()
    finally:
        for replica in replicas:
            replica.terminate()
        for replica in replicas:
            replica.wait(timeout=20)
    assert Counter(f.job for f in got) == Counter(JOBS)
    pids = {replica.pid: index for index, replica in enumerate(replicas)}
    judged_by = {f.job: pids[int(f.source.instance.rsplit(":", 1)[1])] for f in got}
    assert judged_by == owners
