"""resurge.runtime.together: parts run as one, and stopped for sure (a part that loses a
cancel, as ``asyncio.wait_for`` can on Python 3.11, is cancelled again)."""

from __future__ import annotations

import asyncio

import pytest

from resurge.runtime.together import stop_all, together


def swallowing(times: int, counted: list[int]) -> object:
    """A part that goes on after its first ``times`` cancels (counting each)."""

    async def part() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                counted.append(1)
                if len(counted) > times:
                    raise

    return part


async def test_a_part_that_loses_its_cancel_is_cancelled_again() -> None:
    counted: list[int] = []
    task = asyncio.create_task(together(swallowing(1, counted), asyncio.Event().wait))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)  # both parts run
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=10)
    assert done and task.cancelled()
    assert len(counted) == 2


async def test_a_task_group_cancels_once_and_waits_for_ever() -> None:
    """Why together exists: the same part under a TaskGroup holds its parent's stop,
    cancelled again or not (the group cancels its tasks once)."""
    counted: list[int] = []
    parts: list[asyncio.Task[None]] = []

    async def grouped() -> None:
        async with asyncio.TaskGroup() as group:
            parts.append(group.create_task(swallowing(1, counted)()))  # type: ignore[operator]

    task = asyncio.create_task(grouped())
    await asyncio.sleep(0.05)
    for _ in range(3):
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=1.2)
        assert not done
    assert len(counted) == 1
    await stop_all(parts)  # its part, cancelled again, ends: then the group does
    await stop_all([task])


async def test_a_part_that_raises_stops_the_others_and_its_error_is_raised() -> None:
    stopped = asyncio.Event()

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("broken part")

    async def other() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    with pytest.raises(ValueError, match="broken part"):
        await together(fails, other)
    assert stopped.is_set()


async def test_a_cancel_during_the_stop_is_kept_until_the_parts_ended() -> None:
    counted: list[int] = []
    task = asyncio.create_task(together(swallowing(2, counted)))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.05)
    task.cancel()  # again, while it stops its part
    done, _ = await asyncio.wait([task], timeout=10)
    assert done and task.cancelled()
    assert len(counted) == 3  # its part ended before it did
