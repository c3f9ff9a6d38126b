"""What job records still owe, finished from the records: the restarter's reconciler.

Every side effect of a decision follows from the job record, so whatever a failure
between steps left undone is found there and done later, by this instance or another,
with no new event: a plan not yet dispatched (:mod:`.dispatch`), a finished job's last
steps not yet done (:mod:`resurge.control.effects.job_finish`). :func:`next_look` says, from a
record alone, when a restarter should look at it again: at the end of the claim while
one is held (its holder is at it until then: the first carrying-out stays inline, on
the fault's path), at once when nothing holds it, never when nothing is owed.

:class:`Reconciler` keeps that time per job, fed by the record watch (this instance's
own writes included) and by what each look leaves owed, and runs a look when it comes
(one supervised loop). A look that fails is tried again ``retry_seconds`` later, and
after each look the job is looked at once more ``retry_seconds`` later, so the work
is finished even when no record write comes back to say what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from resurge.control.state.records import JobRecord
from resurge.runtime.service import ServiceContext

__all__ = ["ASAP", "Reconciler", "next_look"]

ASAP = datetime.min.replace(tzinfo=UTC)
"""A look due at once."""

# A look waits this long past its due time: a claim that lapses then has lapsed.
_PAST_DUE_SECONDS = 0.05

Look = Callable[[str], Awaitable[datetime | None]]
"""Looks at a job's record and does what it owes; returns when to look again (None: never)."""


def next_look(record: JobRecord) -> datetime | None:
    """When to look at ``record`` for what it still owes (None: nothing)."""
    plan = record.pending_recovery
    if plan is not None and not plan.dispatched:
        return plan.claimed_until or ASAP
    ending = record.ending
    if ending is not None and not ending.done:
        return ending.claimed_until or ASAP
    return None


class Reconciler:
    """Runs ``look`` for each job when its time comes (see the module docstring)."""

    def __init__(self, ctx: ServiceContext, look: Look, retry_seconds: float) -> None:
        self.ctx = ctx
        self.look = look
        self.retry_seconds = retry_seconds
        self._due: dict[str, datetime] = {}
        self._changed = asyncio.Event()
        # What the loop sleeps until (None: until woken); ASAP while it looks, when what
        # is noted is seen once the looks are done. A look due sooner than that sets an
        # alarm for its time rather than waking the loop now (the fault's path goes on).
        self._until: datetime | None = ASAP
        self._alarm: asyncio.TimerHandle | None = None
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run the loop (:meth:`note` starts it too, if it is not running)."""
        if self._loop is None or self._loop.done():
            self._loop = self.ctx.spawn(self.run, name="reconcile")

    def note(self, name: str, due: datetime | None) -> None:
        """Look at job ``name`` at ``due`` (None: no more), instead of when noted before."""
        if due is None:
            self._due.pop(name, None)
            return
        self._due[name] = due
        if self._loop is None or self._loop.done():
            self.start()
            return
        if self._until is not None and due >= self._until:
            return
        self._until = due
        if self._alarm is not None:
            self._alarm.cancel()
        delay = (due - datetime.now(UTC)).total_seconds() + _PAST_DUE_SECONDS
        self._alarm = asyncio.get_running_loop().call_later(max(delay, 0.0), self._changed.set)

    async def run(self) -> None:
        """Look at each job when it is due, forever."""
        while True:
            now = datetime.now(UTC)
            ready = [name for name, due in self._due.items() if due <= now]
            if ready:
                self._until = ASAP
                for name in ready:
                    del self._due[name]
                    again = await self._look(name)
                    if again is not None and name not in self._due:  # no newer word came
                        self._due[name] = again
                continue
            self._until = min(self._due.values(), default=None)
            self._changed.clear()
            wait = None
            if self._until is not None:
                wait = (self._until - now).total_seconds() + _PAST_DUE_SECONDS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait)
            self._until = ASAP
            if self._alarm is not None:
                self._alarm.cancel()
                self._alarm = None

    async def _look(self, name: str) -> datetime | None:
        later = datetime.now(UTC) + timedelta(seconds=self.retry_seconds)
        try:
            due = await self.look(name)
        except Exception:
            self.ctx.log.exception(
                "finishing what %s's record owes failed; trying again in %.1f s",
                name,
                self.retry_seconds,
                extra={"job": name},
            )
            return later
        return None if due is None else max(due, later)
