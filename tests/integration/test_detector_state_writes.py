"""The detector's state store writes one save's entries together, on a real server: a
job's new generation changes one entry per replica, and the save holds the batch it
follows (acked after it), so thousands of writes one after another held the detector's
reading of events for seconds (at 4,096 ranks, live ranks then looked silent). What a
failed save did not write is written by the next."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import nats.js.errors
import pytest
from nats.js.kv import KeyValue

from resurge.control.state.records import JobRecord, Placement
from resurge.events import JobPhase, Progress
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus
from resurge.runtime.kv_keys import bucket_keys
from resurge_detector.facts import unpack
from resurge_detector.hang import HangDetector
from resurge_detector.runtime import DetectorRuntime, Partition
from resurge_detector.state_store import (
    STATE_BUCKET,
    WRITES_IN_FLIGHT,
    StateStore,
    state_entry_key,
)

JOB = "wide"
REPLICAS = 1024


class Overlapping:
    """A real bucket whose writes are counted while they wait for their acks."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.waiting = 0
        self.most = 0

    async def put(self, key: str, value: bytes) -> int:
        self._begin()
        try:
            return await self.kv.put(key, value)
        finally:
            self.waiting -= 1

    async def delete(self, key: str) -> bool:
        self._begin()
        try:
            return await self.kv.delete(key)
        finally:
            self.waiting -= 1

    def _begin(self) -> None:
        self.waiting += 1
        self.most = max(self.most, self.waiting)


def reporting_runtime(bus: Bus) -> DetectorRuntime:
    """A hang detector that saw every rank of a running job of ``REPLICAS`` replicas
    report once (a new generation: one changed entry per replica)."""
    spec = job(JOB, nproc=1, replicas=REPLICAS, preload=None)
    placements = [Placement(replica=r, node=f"n{r}") for r in range(REPLICAS)]
    record = JobRecord(name=JOB, spec=spec, phase=JobPhase.RUNNING, placements=placements)
    runtime = DetectorRuntime([HangDetector()], bus.source, Partition())
    runtime.set_job(JOB, record)
    now = datetime.now(UTC)
    reports = [
        Progress(
            source=bus.source,
            job=JOB,
            replica=r,
            node=f"n{r}",
            rank=r,
            generation=0,
            local_rank=0,
            step=1,
        )
        for r in range(REPLICAS)
    ]
    runtime.observe_all(reports, now)
    return runtime


async def stored(kv: KeyValue) -> dict[str, set[int]]:
    """Each stored hang entry's key -> the ranks its facts hold."""
    out: dict[str, set[int]] = {}
    for key in await bucket_keys(kv):
        entry = await kv.get(key)
        if entry.value and not key.endswith(".learned"):
            out[key] = {int(rank) for rank in unpack(entry.value)["ranks"]}
    return out


async def test_one_save_writes_a_new_generation_s_entries_together(bus: Bus) -> None:
    store = await StateStore.open(bus, reporting_runtime(bus))
    kv = store.kv
    overlapping = Overlapping(kv)
    store.kv = cast(KeyValue, overlapping)
    await store.save()
    assert 1 < overlapping.most <= WRITES_IN_FLIGHT
    expected = {state_entry_key("hang", JOB, f"r{r}"): {r} for r in range(REPLICAS)}
    assert await stored(kv) == expected
    assert len(await bucket_keys(kv)) == REPLICAS + 1  # and the job's learned pace


async def test_what_a_failed_save_did_not_write_the_next_writes(bus: Bus) -> None:
    store = await StateStore.open(bus, reporting_runtime(bus))
    await bus.js.delete_key_value(bus.subjects.kv_bucket(STATE_BUCKET))
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await store.save()
    store.kv = await bus.create_bucket(STATE_BUCKET, history=1)
    await store.save()
    expected = {state_entry_key("hang", JOB, f"r{r}"): {r} for r in range(REPLICAS)}
    assert await stored(store.kv) == expected
