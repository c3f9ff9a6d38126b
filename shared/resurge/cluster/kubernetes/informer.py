"""Informers: one list-then-watch per kind (and selector) per process, shared by all readers.

An :class:`Informer` follows one list function of the official client
(:func:`.watch.follow_in_thread`: listed once, then watched with bookmarks, resumed from
the last version seen), started on first use, and keeps every object as last seen: its
cache. It runs until its event loop shuts down its asynchronous generators (as
``asyncio.run`` does before it returns): then its thread is stopped and waited for, so
none is left reading when the interpreter exits.

- :meth:`Informer.objects` and :meth:`Informer.get` read the cache (waiting for the first
  list once); they never call the API. :attr:`Informer.changes_seen` counts the cache's
  changes, so what a reader works out from it is worked out again only after one.
- :meth:`Informer.changes` hands a subscriber the cache as it is (``ADDED`` each), one
  ``SYNCED`` once the first list is in, then every change, in the order the server made
  them.
- :meth:`Informer.written` puts an object a write just returned into the cache (and
  tells the subscribers), so a reader sees its own write before the watch brings it, as
  client-go's mutation cache does: the watch's copy of the same or an older version is
  then skipped. resourceVersions are compared as integers, as that cache does (an etcd
  revision); a version that is not one is taken as newer.

:func:`informer` gives the one informer of a :class:`~.api.KubeApi`, list function and
arguments on the running event loop, so the backend and the controller of one process
share one watch per kind.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import Any

from resurge.cluster.kubernetes.api import KubeApi
from resurge.cluster.kubernetes.watch import (
    SYNCED,
    Change,
    Following,
    follow_in_thread,
    next_change,
    object_key,
)

__all__ = ["Informer", "informer"]

Key = tuple[str, str]

# How long the loop's shutdown waits for an informer's thread to end its stream.
_STOP_SECONDS = 5.0


def _revision(obj: dict[str, Any]) -> int | None:
    text = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(text))
    except ValueError:
        return None


class Informer:
    """The cache of one list function's objects, kept by one watch (module docstring)."""

    def __init__(self, list_fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self.list_fn = list_fn
        self.kwargs = kwargs
        self.cache: dict[Key, dict[str, Any]] = {}
        # Bumped at each change of the cache: what a reader derives from the cache is
        # still true while it is unchanged.
        self.changes_seen = 0
        # The last revision seen of each key, deletions included: a stale copy of an
        # object (an older write's answer, a late watch event) never replaces a newer one.
        self._revisions: dict[Key, int] = {}
        self._subscribers: set[asyncio.Queue[Change | BaseException]] = set()
        self._synced = asyncio.Event()
        self._failed: BaseException | None = None
        self._following: Following | None = None
        self._lifetime: AsyncGenerator[None, None] | None = None

    async def _start(self) -> None:
        if self._following is None:
            self._following = follow_in_thread(self.list_fn, self.kwargs, self._on_event)
            if self._lifetime is None:  # the loop closes it as it shuts down
                self._lifetime = self._live()
                await anext(self._lifetime)

    async def _live(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            following, self._following = self._following, None
            if following is not None:
                following.stop()
                following.join(_STOP_SECONDS)

    @property
    def version(self) -> str:
        """The resourceVersion the watch resumes from (its last event's or bookmark's)."""
        return "" if self._following is None else self._following.version

    def _on_event(self, item: Change | BaseException) -> None:
        if isinstance(item, BaseException):  # the follower gave up: tell everyone
            self._failed = item
            self._following = None
            self._synced.set()
            for queue in self._subscribers:
                queue.put_nowait(item)
            return
        kind, obj = item
        if kind == SYNCED:
            self._synced.set()
            self._tell((SYNCED, {}))
        else:
            self._apply(kind, obj)

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        revision = _revision(obj)
        seen = self._revisions.get(key)
        if revision is not None and seen is not None and revision <= seen:
            return  # this version (or a newer one) is in the cache already
        if revision is not None:
            self._revisions[key] = revision
        if kind == "DELETED":
            if self.cache.pop(key, None) is not None:
                self.changes_seen += 1
                self._tell((kind, obj))
            return
        kind = "MODIFIED" if key in self.cache else "ADDED"
        self.cache[key] = obj
        self.changes_seen += 1
        self._tell((kind, obj))

    def _tell(self, change: Change) -> None:
        for queue in self._subscribers:
            queue.put_nowait(change)

    async def synced(self) -> None:
        """Wait until the cache holds the first list; raise what stopped the informer."""
        if self._failed is not None:
            failed, self._failed = self._failed, None
            self._synced = asyncio.Event()
            self.cache.clear()
            self.changes_seen += 1
            self._revisions.clear()
            raise failed
        await self._start()
        await self._synced.wait()
        if self._failed is not None:
            await self.synced()  # raises it

    async def objects(self) -> list[dict[str, Any]]:
        """Every object in the cache."""
        await self.synced()
        return list(self.cache.values())

    async def get(self, name: str, namespace: str = "") -> dict[str, Any] | None:
        """The cached object named ``name`` (in ``namespace``); None if none is."""
        await self.synced()
        return self.cache.get((namespace, name))

    def written(self, obj: dict[str, Any]) -> None:
        """Take ``obj``, as a write of it just returned it, into the cache (if the
        informer runs: one that does not lists it when it starts)."""
        if self._following is not None:
            self._apply("MODIFIED", obj)

    async def changes(self) -> AsyncGenerator[Change, None]:
        """The cache now (``ADDED`` each; ``SYNCED`` if the first list is in, else when it
        is), then every change, until the caller stops; the informer's failure is raised
        here."""
        await self._start()
        queue: asyncio.Queue[Change | BaseException] = asyncio.Queue()
        for obj in self.cache.values():
            queue.put_nowait(("ADDED", obj))
        if self._synced.is_set():
            queue.put_nowait((SYNCED, {}))
        self._subscribers.add(queue)
        try:
            while True:
                yield await next_change(queue)
        finally:
            self._subscribers.discard(queue)


_INFORMERS: weakref.WeakKeyDictionary[
    KubeApi, dict[tuple[Any, ...], tuple[asyncio.AbstractEventLoop, Informer]]
] = weakref.WeakKeyDictionary()


def informer(kube: KubeApi, list_fn: Callable[..., Any], **kwargs: Any) -> Informer:
    """The one informer of ``kube`` that follows ``list_fn(**kwargs)`` on the running
    event loop (``list_fn`` a list method of one of ``kube``'s APIs, as
    :func:`.watch.follow` takes)."""
    loop = asyncio.get_running_loop()
    key = (list_fn, *sorted(kwargs.items()))
    held = _INFORMERS.setdefault(kube, {})
    found = held.get(key)
    if found is None or found[0] is not loop:
        found = (loop, Informer(list_fn, kwargs))
        held[key] = found
    return found[1]
