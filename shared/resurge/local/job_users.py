"""The placements that need a NATS user of their own on a local cluster with users.

A launch agent connects as the user of its job on its node
(:func:`resurge.access.permissions.job_agent_user`), so a worker that steals its
agent's credentials can publish only that job's raw events on that node.
:class:`PlacementWatch` runs a thread of its own that watches the worker groups (as the
cluster's admin) and hands each (node, job) pair it has not seen to the supervisor's
loop (:meth:`new`), which makes the user, has the server reload its config and only
then puts the credentials file where the node's monitor waits for it
(:meth:`resurge.local.access.LocalAccess.add_job_agent`). A watch that breaks (a NATS
outage) starts again after a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading

from resurge.cluster.local.backend import LocalBackend
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

__all__ = ["PlacementWatch"]

log = logging.getLogger("resurge.local.job_users")

_RETRY_SECONDS = 1.0


class PlacementWatch:
    """(node, job) of every worker group written, each once, from a thread of its own."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._found: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._seen: set[tuple[str, str]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="placement-watch", daemon=True)

    def start(self) -> None:
        """Start watching (returns at once)."""
        self._thread.start()
        self._started.wait()

    def new(self) -> list[tuple[str, str]]:
        """The (node, job) pairs found since the last call that were never seen before."""
        pairs: list[tuple[str, str]] = []
        while True:
            try:
                pair = self._found.get_nowait()
            except queue.Empty:
                return pairs
            if pair not in self._seen:
                self._seen.add(pair)
                pairs.append(pair)

    def stop(self) -> None:
        """Stop watching and wait for the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._started.set()
        while not self._stop.is_set():
            watching = asyncio.create_task(self._watch())
            stopping = asyncio.create_task(self._stop.wait())
            await asyncio.wait({watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
            for task in (watching, stopping):
                task.cancel()
            await asyncio.gather(watching, stopping, return_exceptions=True)
            if watching.done() and not watching.cancelled() and watching.exception():
                log.warning("watching worker groups failed (%s); again", watching.exception())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), _RETRY_SECONDS)

    async def _watch(self) -> None:
        bus = await Bus.connect(self.settings, "supervisor")
        try:
            backend = await LocalBackend.open(bus)
            async for change in backend.watch():
                group = change.worker_group
                if group is not None and not change.deleted:
                    self._found.put((group.node, group.job))
        finally:
            await bus.close()
