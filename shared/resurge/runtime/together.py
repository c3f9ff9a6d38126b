"""Run several coroutines as one, and stop them for sure.

:func:`together` runs each part as a task until all have ended; one that raises has
the others stopped and its exception raised, as an ``asyncio.TaskGroup`` would (but the
exception itself, not a group). Cancelled, it stops them all before it ends.

Stopping (:func:`stop_all`) cancels each task again every :data:`RECANCEL_SECONDS` until
it has ended, and a cancel of the stopping task meanwhile is kept for after. A
``TaskGroup`` cancels its tasks once: on Python 3.11 ``asyncio.wait_for`` (inside
nats.py's requests) can lose a cancel that arrives with its reply, and the task then
goes on, here a loop awaiting its next update, holding its service's stop for ever (a
scaler ignored SIGTERM so in CI, its status writer still waiting under the TaskGroup).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

__all__ = ["RECANCEL_SECONDS", "stop_all", "together"]

RECANCEL_SECONDS = 1.0


async def together(*parts: Callable[[], Awaitable[object]]) -> None:
    """Run every part until all end; the first to raise stops the others and its
    exception is raised; cancelled, every part is stopped first."""
    tasks = [asyncio.ensure_future(_awaited(part)) for part in parts]
    try:
        while pending := [task for task in tasks if not task.done()]:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and (error := task.exception()) is not None:
                    raise error
    finally:
        await stop_all(tasks)


async def stop_all(tasks: Iterable[asyncio.Future[None]]) -> None:
    """Cancel ``tasks``, again every :data:`RECANCEL_SECONDS`, until each has ended;
    a cancel of the caller meanwhile is raised once they have."""
    tasks = list(tasks)
    cancelled = False
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        try:
            await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
        except asyncio.CancelledError:
            cancelled = True  # the tasks end first
    for task in tasks:  # their outcome is known: nothing is left "never retrieved"
        if not task.cancelled():
            task.exception()
    if cancelled:
        raise asyncio.CancelledError


async def _awaited(part: Callable[[], Awaitable[object]]) -> None:
    await part()
