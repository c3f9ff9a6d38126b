"""Each event handled once though it arrives twice: live first, stored after.

An urgent event (a worker's exit) reaches its service by two routes: a core
subscription sees it the moment the server receives it (*live*), and a durable
consumer delivers it once the stream has stored it (*stored*: later, and much later
when the stream is busy storing telemetry). The live copy buys speed; the stored copy
keeps the guarantee (an event published while the service was away, or whose live
copy was dropped or failed, is still handled).

:class:`LiveFirst` lets a service handle whichever copy comes first and skip the other:

- :meth:`LiveFirst.live` handles an event not yet handled (nor being handled); a
  failure is logged and counted, and left to the stored copy;
- :meth:`LiveFirst.taken` says whether a stored copy may be skipped (its live copy was
  handled; a live copy still being handled is waited for first), and
  :meth:`LiveFirst.remember` notes a stored copy the service handled, so a live copy
  that comes after it is skipped.

Handled event ids are remembered in a bounded memory (``memory`` ids, oldest forgotten
first). Forgetting is safe where the handling behind it is idempotent (the detector's
conclusions carry ids derived from the event's, which JetStream de-duplicates); the
memory only saves the work. Outcomes are counted in
``resurge_live_first_total{route, outcome}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter

from resurge.runtime.logs import RateLimitedLog

__all__ = ["LiveFirst"]

log = logging.getLogger("resurge.runtime.live_first")


class LiveFirst:
    """Which events were handled (or are being handled) by either route; see the module."""

    def __init__(self, registry: CollectorRegistry, *, memory: int = 10_000) -> None:
        self.memory = memory
        self._done: OrderedDict[str, None] = OrderedDict()
        self._running: dict[str, asyncio.Event] = {}  # set when its handling ends
        self._log = RateLimitedLog(log, interval=60.0)
        self.outcomes = Counter(
            "resurge_live_first_total",
            "Urgent events by the route they came by (live: core subscription, stored: "
            "durable consumer) and what became of that copy (handled, skipped: the other "
            "copy was handled, failed: left to the stored copy).",
            ["route", "outcome"],
            registry=registry,
        )

    def handled(self, event_id: str) -> bool:
        """Whether ``event_id`` was handled (by either route) and is still remembered."""
        return event_id in self._done

    async def live(self, event_id: str, handle: Callable[[], Awaitable[None]]) -> None:
        """Handle the live copy of ``event_id`` unless it is handled or being handled."""
        if event_id in self._done or event_id in self._running:
            self.outcomes.labels("live", "skipped").inc()
            return
        finished = self._running[event_id] = asyncio.Event()
        try:
            await handle()
        except Exception as error:  # the stored copy comes and is handled then
            self.outcomes.labels("live", "failed").inc()
            self._log.warning("live", f"handling a live event failed: {error!r}")
        else:
            self.outcomes.labels("live", "handled").inc()
            self._remember(event_id)
        finally:
            del self._running[event_id]
            finished.set()

    async def taken(self, event_id: str) -> bool:
        """Whether the stored copy of ``event_id`` may be skipped: its live copy was
        handled (a live copy being handled is waited for first). The service handles
        the stored copies not taken, then calls :meth:`remember` for each."""
        running = self._running.get(event_id)
        if running is not None:
            await running.wait()
        if event_id in self._done:
            self.outcomes.labels("stored", "skipped").inc()
            return True
        return False

    def remember(self, event_id: str) -> None:
        """Note ``event_id`` as handled by its stored copy (a late live copy is skipped)."""
        self.outcomes.labels("stored", "handled").inc()
        self._remember(event_id)

    def _remember(self, event_id: str) -> None:
        self._done[event_id] = None
        self._done.move_to_end(event_id)
        while len(self._done) > self.memory:
            self._done.popitem(last=False)
