"""A service's background tasks, supervised: none dies unseen.

:meth:`Supervisor.spawn` runs a task and keeps watch over it:

- a **loop** (``spawn`` given a function that makes the coroutine: the service's
  ticks, watches and pumps) that raises is logged with its traceback, counted in
  ``resurge_task_restarts_total{task}``, and started again after a backoff that
  doubles from :data:`BACKOFF_FIRST_SECONDS` up to :data:`BACKOFF_MAX_SECONDS` (back
  to the first once a run lasted :data:`HEALTHY_RUN_SECONDS`). A loop that returns
  while the service runs is logged and stays dead.
- a **one-shot** task (``spawn`` given a coroutine: a timer, one carrying-out) that
  raises is logged with its traceback and counted in ``resurge_task_failures_total``;
  it cannot run again (the coroutine is spent), so whoever spawned it recovers.

A failure while ``excused()`` says so (the service's bus is down: the outage's failure,
not the process's) is retried the same way but makes no problem, then or later.

:meth:`Supervisor.problems` says what makes the service unhealthy (``/livez``
answers 503 with these lines): a loop that ended, a loop waiting out its backoff, a
loop that failed :data:`CRASH_LOOP_FAILURES` times within :data:`CRASH_LOOP_SECONDS`.
Every task, one-shot or loop, is cancelled when the service stops (:attr:`tasks`);
the ``task`` label is the name given to ``spawn`` (or the coroutine's qualified
name), a name from the code, so it stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

__all__ = [
    "BACKOFF_FIRST_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "CRASH_LOOP_FAILURES",
    "CRASH_LOOP_SECONDS",
    "HEALTHY_RUN_SECONDS",
    "Supervisor",
    "Work",
]

BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
# A run this long ends a series of failures: the next failure waits the first backoff.
HEALTHY_RUN_SECONDS = 60.0
# This many failures of one loop within the window mark the service unhealthy (a
# Kubernetes liveness probe then restarts it) even while the loop is running again.
CRASH_LOOP_FAILURES = 5
CRASH_LOOP_SECONDS = 300.0

Work = Coroutine[Any, Any, None] | Callable[[], Coroutine[Any, Any, None]]
"""A one-shot coroutine, or a function making a loop's coroutine (called at each start)."""


@dataclass
class _Loop:
    name: str
    failures: deque[float] = field(default_factory=deque)  # monotonic times, in the window
    backoff_until: float | None = None
    excused: bool = False  # its last failure came while the supervisor was excused
    ended: bool = False


class Supervisor:
    """Runs and watches one service's background tasks (see the module docstring)."""

    def __init__(
        self,
        log: logging.Logger,
        registry: CollectorRegistry,
        *,
        backoff_first: float = BACKOFF_FIRST_SECONDS,
        backoff_max: float = BACKOFF_MAX_SECONDS,
        excused: Callable[[], bool] = lambda: False,
    ) -> None:
        self.log = log
        # While this says so (the bus is down), a loop's failure is the outage's, not the
        # process's: it is retried with backoff but makes no health problem, then or later.
        self.excused = excused
        self.backoff_first = backoff_first
        self.backoff_max = backoff_max
        self.tasks: set[asyncio.Task[None]] = set()
        self._loops: list[_Loop] = []
        self.restarts = Counter(
            "resurge_task_restarts_total",
            "Restarts of a service's background loop after it raised, by task.",
            ["task"],
            registry=registry,
        )
        self.failures = Counter(
            "resurge_task_failures_total",
            "One-shot background tasks of a service that raised, by task.",
            ["task"],
            registry=registry,
        )

    def spawn(self, work: Work, *, name: str | None = None) -> asyncio.Task[None]:
        """Run ``work`` in the background until it ends or the service stops: a
        coroutine once, a function making a coroutine as a loop restarted when it
        raises."""
        loop: _Loop | None = None
        if asyncio.iscoroutine(work):
            label = name or str(getattr(work, "__qualname__", "task"))
            coro = self._once(label, work)
        else:
            assert callable(work)
            label = name or str(getattr(work, "__qualname__", "loop"))
            loop = _Loop(label)
            coro = self._supervise(loop, work)
        task = asyncio.get_running_loop().create_task(coro, name=label)
        if loop is not None:
            self._loops.append(loop)
            task.add_done_callback(lambda _: self._forget(loop))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def problems(self) -> list[str]:
        """Why the service's loops make it unhealthy; empty while all are well."""
        now = time.monotonic()
        found = []
        for loop in list(self._loops):  # read from the HTTP server's thread
            _forget_before(loop.failures, now - CRASH_LOOP_SECONDS)
            if loop.ended:
                found.append(f"task {loop.name} ended")
            elif loop.backoff_until is not None and loop.backoff_until > now and not loop.excused:
                found.append(
                    f"task {loop.name} failed; restarting in {loop.backoff_until - now:.1f} s"
                )
            elif len(loop.failures) >= CRASH_LOOP_FAILURES:
                found.append(
                    f"task {loop.name} failed {len(loop.failures)} times "
                    f"in {CRASH_LOOP_SECONDS:g} s"
                )
        return found

    def _forget(self, loop: _Loop) -> None:
        if not loop.ended:  # cancelled: the service stops (an ended loop stays a problem)
            self._loops.remove(loop)

    async def _once(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except Exception:
            self.failures.labels(name).inc()
            self.log.exception("background task %s failed", name)

    async def _supervise(self, loop: _Loop, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        delay = self.backoff_first
        while True:
            started = time.monotonic()
            try:
                await make()
            except Exception:
                now = time.monotonic()
                if now - started >= HEALTHY_RUN_SECONDS:
                    delay = self.backoff_first
                loop.excused = self.excused()
                if not loop.excused:
                    loop.failures.append(now)
                loop.backoff_until = now + delay
                self.log.exception("task %s failed; restarting it in %.1f s", loop.name, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_max)
                loop.backoff_until = None
                self.restarts.labels(loop.name).inc()
                self.log.info("task %s restarted", loop.name)
            else:
                loop.ended = True
                self.log.warning("task %s ended; it is not restarted", loop.name)
                return


def _forget_before(times: deque[float], oldest: float) -> None:
    while times and times[0] < oldest:
        times.popleft()
