"""Job records in JetStream KV: every write is a compare-and-set."""

import asyncio

from resurge.control.records import JobRecord, JobStore
from resurge.events import JobPhase
from resurge.local import job_factory
from resurge.runtime.bus import Bus


def record(name: str = "team.job") -> JobRecord:
    return JobRecord(name=name, spec=job_factory.job("j", preload=None))


async def test_create_is_once_only(bus: Bus) -> None:
    store = JobStore(await bus.jobs_bucket())
    assert await store.create(record())
    assert not await store.create(record())
    found = await store.get("team.job")
    assert found is not None and found[0].name == "team.job"


async def test_replace_fails_on_a_stale_revision(bus: Bus) -> None:
    store = JobStore(await bus.jobs_bucket())
    await store.create(record())
    found = await store.get("team.job")
    assert found is not None
    first, revision = found
    first.generation = 1
    assert await store.replace(first, revision)
    first.generation = 2
    assert not await store.replace(first, revision)


async def test_concurrent_mutations_all_land(bus: Bus) -> None:
    store = JobStore(await bus.jobs_bucket())
    await store.create(record())

    def bump(rec: JobRecord) -> bool:
        rec.generation += 1
        return True

    await asyncio.gather(*(store.mutate("team.job", bump) for _ in range(8)))
    found = await store.get("team.job")
    assert found is not None and found[0].generation == 8


async def test_mutate_without_change_writes_nothing(bus: Bus) -> None:
    store = JobStore(await bus.jobs_bucket())
    await store.create(record())
    before = await store.get("team.job")
    result = await store.mutate("team.job", lambda rec: rec.phase is JobPhase.FAILED)
    after = await store.get("team.job")
    assert result is not None and result[0] is result[1]
    assert before is not None and after is not None and before[1] == after[1]
    assert await store.mutate("missing", lambda rec: True) is None


async def test_mutate_from_a_stale_read_reads_again_and_loses_no_write(bus: Bus) -> None:
    store = JobStore(await bus.jobs_bucket())
    await store.create(record())
    stale = await store.get("team.job")
    assert stale is not None

    def bump(rec: JobRecord) -> bool:
        rec.generation += 1
        return True

    await store.mutate("team.job", bump)  # written after the read the next call reuses
    result = await store.mutate("team.job", bump, read=stale)
    assert result is not None
    assert (result[0].generation, result[1].generation) == (1, 2)
    found = await store.get("team.job")
    assert found is not None and found[0].generation == 2
