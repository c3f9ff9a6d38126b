"""Job records in JetStream KV: every write is a compare-and-set."""

import asyncio

from resurge.control.state.records import JobRecord, JobStore
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


async def test_a_store_starts_from_the_record_it_wrote_and_finds_another_writers_change(
    bus: Bus,
) -> None:
    bucket = await bus.jobs_bucket()
    mine, theirs = JobStore(bucket), JobStore(bucket)
    await mine.create(record())
    remembered = mine.remembered("team.job")
    assert remembered is not None and remembered[0].generation == 0

    def bump(rec: JobRecord) -> bool:
        rec.generation += 1
        return True

    await theirs.mutate("team.job", bump)  # mine's memory of the record is now stale
    result = await mine.mutate("team.job", bump)
    assert result is not None and (result[0].generation, result[1].generation) == (1, 2)
    found = await theirs.get("team.job")
    assert found is not None and found[0].generation == 2
    remembered = mine.remembered("team.job")
    assert remembered is not None and remembered == (result[1], found[1])


async def test_nothing_to_do_in_a_stale_memory_is_checked_on_a_fresh_read(bus: Bus) -> None:
    bucket = await bus.jobs_bucket()
    mine, theirs = JobStore(bucket), JobStore(bucket)
    await mine.create(record())

    def fail(rec: JobRecord) -> bool:
        rec.phase = JobPhase.FAILED
        return True

    await theirs.mutate("team.job", fail)
    seen: list[JobPhase] = []

    def running_to_succeeded(rec: JobRecord) -> bool:
        seen.append(rec.phase)
        if rec.phase is not JobPhase.FAILED:
            return False
        rec.phase = JobPhase.SUCCEEDED
        return True

    result = await mine.mutate("team.job", running_to_succeeded)
    assert seen == [JobPhase.PENDING, JobPhase.FAILED]  # remembered, then read
    assert result is not None and result[1].phase is JobPhase.SUCCEEDED


async def test_a_remembered_record_of_a_deleted_job_is_not_mutated(bus: Bus) -> None:
    bucket = await bus.jobs_bucket()
    store = JobStore(bucket)
    await store.create(record())
    await bucket.delete(JobStore.key("team.job"))
    assert store.remembered("team.job") is not None
    assert await store.mutate("team.job", lambda rec: True) is None
    assert await JobStore(bucket).get("team.job") is None
