"""LiveFirst: an event that arrives live and stored is handled once, by the first copy
that succeeds; a failed live copy is left to the stored one. Ordering is made with
events the test sets, never with timing."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from resurge.runtime.live_first import LiveFirst


def outcomes(first: LiveFirst) -> dict[tuple[str, str], float]:
    counts: dict[tuple[str, str], float] = {}
    for metric in first.outcomes.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                counts[(sample.labels["route"], sample.labels["outcome"])] = sample.value
    return counts


class Handler:
    """Counts its calls; may be held open until released, or fail."""

    def __init__(self, *, hold: bool = False, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        if not hold:
            self.release.set()

    async def __call__(self) -> None:
        self.calls += 1
        self.entered.set()
        await self.release.wait()
        if self.fail:
            raise RuntimeError("handler failed")


async def test_the_stored_copy_of_a_handled_live_event_is_skipped() -> None:
    first = LiveFirst(CollectorRegistry())
    handle = Handler()
    await first.live("e1", handle)
    assert await first.taken("e1")
    assert handle.calls == 1
    assert outcomes(first) == {("live", "handled"): 1, ("stored", "skipped"): 1}


async def test_the_stored_copy_waits_for_a_live_copy_being_handled() -> None:
    first = LiveFirst(CollectorRegistry())
    handle = Handler(hold=True)
    live = asyncio.create_task(first.live("e1", handle))
    await handle.entered.wait()
    stored = asyncio.create_task(first.taken("e1"))
    await asyncio.sleep(0)  # it runs up to its wait and stays there
    assert not stored.done()
    handle.release.set()
    await live
    assert await stored is True
    assert handle.calls == 1


async def test_a_failed_live_copy_is_left_to_the_stored_copy() -> None:
    first = LiveFirst(CollectorRegistry())
    failing = Handler(hold=True, fail=True)
    live = asyncio.create_task(first.live("e1", failing))
    await failing.entered.wait()
    stored = asyncio.create_task(first.taken("e1"))
    failing.release.set()
    await live  # the failure is logged and counted, not raised
    assert await stored is False  # so the service handles the stored copy
    first.remember("e1")
    assert first.handled("e1")
    assert outcomes(first) == {("live", "failed"): 1, ("stored", "handled"): 1}


async def test_a_live_copy_after_the_stored_one_is_skipped() -> None:
    first = LiveFirst(CollectorRegistry())
    handle = Handler()
    assert not await first.taken("e1")
    first.remember("e1")
    await first.live("e1", handle)
    assert handle.calls == 0
    assert outcomes(first) == {("stored", "handled"): 1, ("live", "skipped"): 1}


async def test_a_second_live_copy_while_the_first_is_handled_is_skipped() -> None:
    first = LiveFirst(CollectorRegistry())
    handle = Handler(hold=True)
    live = asyncio.create_task(first.live("e1", handle))
    await handle.entered.wait()
    await first.live("e1", handle)
    handle.release.set()
    await live
    assert handle.calls == 1
    assert outcomes(first) == {("live", "skipped"): 1, ("live", "handled"): 1}


async def test_the_memory_is_bounded_oldest_first() -> None:
    first = LiveFirst(CollectorRegistry(), memory=3)
    for n in range(5):
        await first.live(f"e{n}", Handler())
    assert [first.handled(f"e{n}") for n in range(5)] == [False, False, True, True, True]
