"""The scaler writes each job's status through the cluster backend as its record changes:
what ``read_job_status`` gives is the status view of the record, phase by phase."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from resurge.cluster import ClusterBackend, NodeInfo, open_backend
from resurge.cluster.local.keys import JOB_STATUS_BUCKET
from resurge.control.effects.client import submit_job
from resurge.control.state.records import JobStore, status_view
from resurge.events import CapacityChanged, JobPhase
from resurge.local.job_factory import job
from resurge.runtime.bus import JOBS_BUCKET, Bus
from resurge.runtime.settings import Settings

JOB = "status.job"  # a dot: job names are escaped in keys


@pytest.fixture
def scaler(settings: Settings) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "resurge_scaler"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield proc
    proc.terminate()
    proc.wait(timeout=20)


class StatusWatch:
    """Checks the written status against the job record at every write to either."""

    def __init__(self, bus: Bus, backend: ClusterBackend) -> None:
        self.bus = bus
        self.backend = backend
        self._changed = asyncio.Condition()
        self._writes = 0
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        """Subscribe to the writes of both buckets."""
        for name in (JOBS_BUCKET, JOB_STATUS_BUCKET):
            bucket = self.bus.subjects.kv_bucket(name)
            self._subs.append(await self.bus.nc.subscribe(f"$KV.{bucket}.>", cb=self._wrote))
        await self.bus.nc.flush()

    async def stop(self) -> None:
        """Unsubscribe."""
        for sub in self._subs:
            await sub.unsubscribe()

    async def _wrote(self, _msg: Msg) -> None:
        async with self._changed:
            self._writes += 1
            self._changed.notify_all()

    async def _write_after(self, seen: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._writes != seen)

    async def until_status_shows(self, phase: JobPhase, seconds: float = 30) -> dict[str, object]:
        """The status once it is the view of the record and the record is in ``phase``."""
        store = JobStore(await self.bus.jobs_bucket())

        async def matches() -> dict[str, object] | None:
            found = await store.get(JOB)
            status = await self.backend.read_job_status(JOB)
            if found is None or status is None or found[0].phase is not phase:
                return None
            view = json.loads(json.dumps(status_view(found[0])))
            return status if status == view else None

        async def wait() -> dict[str, object]:
            while True:
                async with self._changed:
                    seen = self._writes
                status = await matches()
                if status is not None:
                    return status
                await self._write_after(seen)

        return await asyncio.wait_for(wait(), seconds)


async def test_the_scaler_writes_each_jobs_status_as_its_record_changes(
    bus: Bus, settings: Settings, scaler: subprocess.Popen[bytes]
) -> None:
    backend = await open_backend(bus, settings)
    watch = StatusWatch(bus, backend)
    await watch.start()
    try:
        await submit_job(bus, job(JOB, nproc=2))
        pending = await watch.until_status_shows(JobPhase.PENDING)

        await backend.report_node(NodeInfo(name="n0", slots=2))
        event = CapacityChanged(
            source=bus.source, node="n0", slots_total=2, slots_free=2, healthy=True
        )
        await bus.publish(bus.subjects.capacity("n0"), event)
        running = await watch.until_status_shows(JobPhase.RUNNING)
    finally:
        await watch.stop()
    assert pending["name"] == JOB and pending["generation"] == 0
    assert str(pending["message"]).startswith("waiting for capacity")
    assert running["replicas"] == {"current": 1, "target": 1}
    assert running["message"] == "running 1 replica(s) on n0"
