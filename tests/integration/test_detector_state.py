"""The detector service keeps what must outlive it: a restart between two workers' success
exits still finishes the replica (and so the job)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable

from nats.aio.msg import Msg

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import Event, JobPhase, ProcessExited, ReplicaFinished
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from resurge_detector.state_store import STATE_BUCKET, state_entry_key
from tests.collect import Events

JOB = "state.job"  # a dot: job names are escaped in subjects and state keys


def start_detector(settings: Settings) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_DETECTORS": "process_exit",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "resurge_detector"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def success(bus: Bus, replica: int, local_rank: int) -> ProcessExited:
    return ProcessExited(
        source=bus.source,
        job=JOB,
        replica=replica,
        node=f"n{replica}",
        rank=replica * 2 + local_rank,
        generation=0,
        pid=100 + local_rank,
        local_rank=local_rank,
        local_world_size=2,
        exit_code=0,
    )


class StateWrites:
    """Every write to the detector's state bucket, seen on its subjects (core NATS)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []  # (key, "put" | "delete")
        self._changed = asyncio.Condition()

    async def add(self, msg: Msg) -> None:
        key = msg.subject.split(".", 2)[2]
        operation = (msg.headers or {}).get("KV-Operation", "PUT")
        async with self._changed:
            self.writes.append((key, "put" if operation == "PUT" else "delete"))
            self._changed.notify_all()

    async def wait_for(self, test: Callable[[list[tuple[str, str]]], bool]) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: test(self.writes)), 30)


async def test_a_detector_restarted_between_success_exits_still_finishes_both_replicas(
    bus: Bus, settings: Settings
) -> None:
    spec = job(JOB, nproc=2, preload=None)
    await JobStore(await bus.jobs_bucket()).create(
        JobRecord(
            name=JOB,
            spec=spec,
            phase=JobPhase.RUNNING,
            placements=[Placement(replica=0, node="n0"), Placement(replica=1, node="n1")],
        )
    )
    state = StateWrites()
    bucket = bus.subjects.kv_bucket(STATE_BUCKET)
    sub = await bus.nc.subscribe(f"$KV.{bucket}.>", cb=state.add)
    jobs = Events()
    await bus.subscribe(bus.subjects.all("job"), jobs.add)
    await bus.nc.flush()
    keys = {state_entry_key("process_exit", JOB, f"r{replica}") for replica in (0, 1)}

    def finished(items: list[Event]) -> set[int | None]:
        return {e.replica for e in items if isinstance(e, ReplicaFinished)}

    detector = start_detector(settings)
    try:
        for replica in (0, 1):
            event = success(bus, replica, 0)
            await bus.publish(bus.subjects.raw(JOB, "process_exited", f"n{replica}"), event)
        await state.wait_for(lambda writes: keys <= {k for k, op in writes if op == "put"})
        assert finished(jobs.items) == set()  # one worker of each replica is still running
        detector.kill()  # no chance to save anything more
        detector.wait(timeout=20)

        detector = start_detector(settings)
        for replica in (0, 1):
            event = success(bus, replica, 1)
            await bus.publish(bus.subjects.raw(JOB, "process_exited", f"n{replica}"), event)
        await jobs.wait_for(lambda items: finished(items) == {0, 1}, 30)
        # Finished replicas need no state: the restarted detector deletes their entries.
        await state.wait_for(lambda writes: keys <= {k for k, op in writes if op == "delete"})
    finally:
        await sub.unsubscribe()
        detector.terminate()
        detector.wait(timeout=20)
    done = [e for e in jobs.items if isinstance(e, ReplicaFinished)]
    assert sorted((e.replica, e.generation) for e in done) == [(0, 0), (1, 0)]
