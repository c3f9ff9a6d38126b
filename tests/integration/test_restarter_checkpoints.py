"""A checkpoint becomes the resume point only once every rank of one generation (at
that generation's world size) reported it saved: real nats-server, real job records, the
real restarter's checkpoint handler (given one report per batch, unless a test says
otherwise); the cluster is :class:`FakeBackend`.

The defect this guards: reports counted by step alone let the old generation's ranks
plus part of the new one's declare a step complete while the rest of the new
generation was still writing it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
from prometheus_client import CollectorRegistry

from resurge.cluster import NodeInfo
from resurge.control.decisions.worker_groups import worker_groups
from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import CheckpointSaved, JobPhase, Source
from resurge.jobspec import parse_job
from resurge.runtime.bus import Bus
from resurge.runtime.service import ServiceContext
from resurge.runtime.settings import Settings
from resurge_restarter.service import Restarter
from tests.integration.fake_backend import FakeBackend

JOB = "saving"
AGENT = Source(service="node-agent", instance="n0:1")


def running_job(generation: int) -> JobRecord:
    spec = parse_job({"metadata": {"name": JOB}, "spec": {"command": ["train"], "nprocPerNode": 2}})
    return JobRecord(
        name=JOB,
        spec=spec,
        phase=JobPhase.RUNNING,
        generation=generation,
        placements=[Placement(replica=0, node="n0"), Placement(replica=1, node="n1")],
    )


def saved(generation: int, rank: int, step: int, world_size: int | None = 4) -> CheckpointSaved:
    return CheckpointSaved(
        source=AGENT, job=JOB, generation=generation, rank=rank, replica=rank // 2,
        node=f"n{rank // 2}", local_rank=rank % 2, step=step, path=f"/ckpt/step-{step}",
        world_size=world_size,
    )  # fmt: skip


@pytest.fixture
async def store(bus: Bus) -> JobStore:
    store = JobStore(await bus.jobs_bucket())
    assert await store.create(running_job(generation=3))
    return store


@pytest.fixture
async def restarter(settings: Settings, bus: Bus, store: JobStore) -> AsyncIterator[Restarter]:
    ctx = ServiceContext("restarter", settings, bus, CollectorRegistry(), AsyncExitStack())
    nodes = [NodeInfo(name=f"n{i}", slots=2) for i in range(2)]
    yield Restarter(ctx, FakeBackend(nodes, worker_groups(running_job(3))), store, me="r")
    for task in list(ctx.tasks):
        task.cancel()
    for task in list(ctx.tasks):
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await ctx.exit_stack.aclose()


async def record_of(store: JobStore) -> JobRecord:
    found = await store.get(JOB)
    assert found is not None
    return found[0]


async def test_two_generations_halves_do_not_complete_a_step(
    store: JobStore, restarter: Restarter
) -> None:
    # Generation 2's ranks 0 and 1 saved step 100 before they were stopped; generation
    # 3's ranks 2 and 3 saved it too, while its ranks 0 and 1 are still writing it.
    for rank in (0, 1):
        await restarter.on_checkpoints([saved(2, rank, 100)])
    for rank in (2, 3):
        await restarter.on_checkpoints([saved(3, rank, 100)])
    assert (await record_of(store)).latest_checkpoint is None

    for rank in (0, 1):
        await restarter.on_checkpoints([saved(3, rank, 100)])
    latest = (await record_of(store)).latest_checkpoint
    assert latest is not None and latest.step == 100


async def test_an_old_generation_completes_a_step_at_its_own_world_size(
    store: JobStore, restarter: Restarter
) -> None:
    # Generation 2 ran 2 ranks (before a grow to 4); both saved step 60, their reports
    # arrive after the record moved to generation 3.
    await restarter.on_checkpoints([saved(2, 0, 60, world_size=2)])
    assert (await record_of(store)).latest_checkpoint is None
    await restarter.on_checkpoints([saved(2, 1, 60, world_size=2)])
    latest = (await record_of(store)).latest_checkpoint
    assert latest is not None and latest.step == 60


async def test_a_report_without_world_size_counts_only_for_the_current_generation(
    store: JobStore, restarter: Restarter
) -> None:
    """An agent of an earlier release says no world size: the record's is the current
    generation's, and no other generation's is known."""
    for rank in range(4):
        await restarter.on_checkpoints([saved(2, rank, 80, world_size=None)])
    assert (await record_of(store)).latest_checkpoint is None
    for rank in range(4):
        await restarter.on_checkpoints([saved(3, rank, 80, world_size=None)])
    latest = (await record_of(store)).latest_checkpoint
    assert latest is not None and latest.step == 80


async def test_a_batch_of_reports_is_one_write_of_the_record(
    store: JobStore, restarter: Restarter
) -> None:
    """A batch of every rank's report completes the step in one compare-and-set: a
    write per report rewrote the whole record once per rank (N squared at scale)."""
    found = await store.get(JOB)
    assert found is not None
    await restarter.on_checkpoints([saved(3, rank, 120) for rank in range(4)])
    after = await store.get(JOB)
    assert after is not None
    assert after[1] == found[1] + 1
    latest = after[0].latest_checkpoint
    assert latest is not None and latest.step == 120 and not after[0].checkpoint_reports


async def test_a_batch_counts_each_job_apart(store: JobStore, restarter: Restarter) -> None:
    other = running_job(generation=3).model_copy(update={"name": "other"})
    assert await store.create(other)
    elsewhere = [s.model_copy(update={"job": "other"}) for s in (saved(3, r, 40) for r in range(4))]
    await restarter.on_checkpoints([saved(3, 0, 40), *elsewhere, saved(3, 1, 40)])
    mine, theirs = await record_of(store), await store.get("other")
    assert mine.latest_checkpoint is None
    assert [e.ranks for e in mine.checkpoint_reports] == [[0, 1]]
    assert theirs is not None and theirs[0].latest_checkpoint is not None
