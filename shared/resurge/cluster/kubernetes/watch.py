"""List-then-watch of one kind of Kubernetes object that survives dropped connections.

:func:`follow` yields ``(type, object)`` pairs (``ADDED``, ``MODIFIED``, ``DELETED``; the
object as the API server's JSON) for one list function of the official ``kubernetes``
client: every object as listed, then each change. It keeps the last resourceVersion it
saw and, when the stream ends or breaks (a dropped connection, the server's timeout, a
read timeout), watches again from it, so no change is missed. When the server answers
that the version is too old (410 Gone, as an ``ERROR`` event or an ``ApiException``),
it lists again and yields the difference from what it had yielded (objects gone as
``DELETED``, new or changed ones as ``ADDED``/``MODIFIED``), so nothing is missed or
yielded twice. After the objects of the first list comes one ``SYNCED`` event.
Objects are told apart by namespace and name; a change is one whose
resourceVersion differs. Watches ask for bookmarks (``allowWatchBookmarks``): the
version a BOOKMARK carries is where the next watch resumes, so a quiet kind's watch
resumes from a recent version instead of one the server may have compacted away (which
would cost a whole list).

The client is synchronous: the list and the watch run in a worker thread
(:func:`follow_in_thread`) that hands events to the event loop; cancelling the iterator
stops the thread's stream, and so does the end of the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

__all__ = [
    "SYNCED",
    "Change",
    "Following",
    "drain",
    "follow",
    "follow_in_thread",
    "next_change",
    "object_key",
    "raise_if_cancelled",
]

log = logging.getLogger("resurge.cluster.kubernetes")

T = TypeVar("T")

Change = tuple[str, dict[str, Any]]
"""A watch event: its type and the object."""

SYNCED = "SYNCED"
"""The type of the one event that follows the objects of the first list (its object is
empty): what follows it are changes."""

# The server ends each watch after ``_SERVER_TIMEOUT_SECONDS`` (where it honours it), and
# it is started again. Seconds without a byte before a watch is taken for dead and started
# again: longer than that, so a quiet watch (no change, a bookmark about every minute) is
# not started again before the server ends it.
_SERVER_TIMEOUT_SECONDS = 55
_READ_TIMEOUT_SECONDS = _SERVER_TIMEOUT_SECONDS + 15.0
_RETRY_SECONDS = 1.0
_GONE = 410


def object_key(obj: dict[str, Any]) -> tuple[str, str]:
    """(namespace, name) of an object; cluster-scoped objects have namespace ``""``."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class _Gone(Exception):
    """The server no longer has the version the watch asked for."""


class Following(Protocol):
    """A follow running in its thread (:func:`follow_in_thread`)."""

    version: str
    """The resourceVersion the next watch starts from (of the last event or bookmark)."""

    def stop(self) -> None:
        """Stop following (the thread ends its stream)."""

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread to end (after :meth:`stop`)."""


class _Follower:
    """The thread side of :func:`follow`: list, watch, resume, relist."""

    def __init__(
        self,
        list_fn: Callable[..., Any],
        kwargs: dict[str, Any],
        emit: Callable[[Change | BaseException], None],
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        self.list_fn = list_fn
        self.kwargs = kwargs
        self.emit = emit
        self.alive = alive
        self.known: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = ""
        self.synced = False
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self._watch: k8s_watch.Watch | None = None

    def join(self, timeout: float) -> None:
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def stop(self) -> None:
        self.stopped.set()
        if threading.current_thread() is self.thread:
            return  # its own stream loop sees the flag and closes the stream
        active = self._watch
        if active is not None:
            # Shuts the stream's socket down, which ends a read blocked on it at once; the
            # reading thread then closes the stream itself.
            active.stop()  # type: ignore[no-untyped-call]  # the client is untyped

    def run(self) -> None:
        try:
            while not self.stopped.is_set() and self.alive():
                try:
                    self._relist()
                    while not self.stopped.is_set() and self.alive():
                        self._watch_once()
                    return
                except _Gone:
                    log.info("watch of %s: version too old, listing again", self._what)
                except Exception as error:
                    if self.stopped.is_set() or not self.alive():
                        return
                    log.warning("watch of %s failed (%r); starting again", self._what, error)
                    self.stopped.wait(_RETRY_SECONDS)
        except BaseException as error:  # never leave the consumer waiting
            self.emit(error)

    @property
    def _what(self) -> str:
        return getattr(self.list_fn, "__name__", "objects")

    def _relist(self) -> None:
        response = self.list_fn(**self.kwargs, _preload_content=False)
        listed = json.loads(response.data)
        items = {object_key(obj): obj for obj in listed.get("items") or []}
        for key in [k for k in self.known if k not in items]:
            self.emit(("DELETED", self.known.pop(key)))
        for key, obj in items.items():
            before = self.known.get(key)
            if before is None:
                self.emit(("ADDED", obj))
            elif _version(before) != _version(obj):
                self.emit(("MODIFIED", obj))
            self.known[key] = obj
        self.version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        if not self.synced:
            self.synced = True
            self.emit((SYNCED, {}))

    def _watch_once(self) -> None:
        watcher = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        self._watch = watcher
        try:
            for event in watcher.stream(  # type: ignore[no-untyped-call]
                self.list_fn,
                **self.kwargs,
                resource_version=self.version,
                allow_watch_bookmarks=True,
                timeout_seconds=_SERVER_TIMEOUT_SECONDS,
                _request_timeout=(_READ_TIMEOUT_SECONDS, _READ_TIMEOUT_SECONDS),
                deserialize=False,
            ):
                if self.stopped.is_set():
                    return
                self._apply(event)
        except ApiException as error:
            if error.status == _GONE:
                raise _Gone from error
            raise
        except Exception as error:  # a dropped or silent connection: watch again
            if not self.stopped.is_set():
                log.debug("watch of %s ended: %r", self._what, error)
        finally:
            self._watch = None

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == _GONE:
                raise _Gone
            raise RuntimeError(f"watch error: {obj.get('reason')}: {obj.get('message')}")
        if kind == "BOOKMARK":
            self.version = _version(obj) or self.version
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        key = object_key(obj)
        version = _version(obj)
        if version:
            self.version = version
        if kind == "DELETED":
            if self.known.pop(key, None) is not None:
                self.emit(("DELETED", obj))
            return
        before = self.known.get(key)
        if before is not None and version and _version(before) == version:
            return  # seen already (a watch started again may send it once more)
        self.known[key] = obj
        self.emit(("ADDED" if before is None else "MODIFIED", obj))


def follow_in_thread(
    list_fn: Callable[..., Any],
    kwargs: dict[str, Any],
    deliver: Callable[[Change | BaseException], None],
) -> Following:
    """Follow ``list_fn(**kwargs)`` as :func:`follow` does, in a thread of its own that
    calls ``deliver`` on the running event loop with each event (or the error that ended
    it), until stopped or until that loop closes."""
    loop = asyncio.get_running_loop()

    def emit(item: Change | BaseException) -> None:
        if follower.stopped.is_set():
            return
        try:
            loop.call_soon_threadsafe(_deliver, item)
        except RuntimeError:  # the loop closed: nobody is listening any more
            follower.stop()

    def _deliver(item: Change | BaseException) -> None:
        if not follower.stopped.is_set():
            deliver(item)

    follower = _Follower(list_fn, kwargs, emit, alive=lambda: not loop.is_closed())
    follower.thread = threading.Thread(target=follower.run, name="kubernetes-watch", daemon=True)
    follower.thread.start()
    return follower


async def follow(list_fn: Callable[..., Any], **kwargs: Any) -> AsyncGenerator[Change, None]:
    """Every object ``list_fn(**kwargs)`` lists, then each change, until cancelled.

    ``list_fn`` is a list method of the official client (``CoreV1Api().list_node``,
    ``CoreV1Api().list_namespaced_pod`` with ``namespace=``...); ``kwargs`` go to both
    the list and the watch (selectors, namespace). An error other than a dropped
    connection or 410 is logged and the list and watch start again a second later.
    """
    queue: asyncio.Queue[Change | BaseException] = asyncio.Queue()
    following = follow_in_thread(list_fn, kwargs, queue.put_nowait)
    try:
        while True:
            yield await next_change(queue)
    finally:
        following.stop()


async def next_change(queue: asyncio.Queue[Change | BaseException]) -> Change:
    """The next change a watch put on ``queue``; the error it put there raised."""
    item = await queue.get()
    if isinstance(item, BaseException):
        raise item
    return item


async def drain(
    queue: asyncio.Queue[T], producers: list[Coroutine[Any, Any, None]]
) -> AsyncGenerator[T, None]:
    """What ``producers`` (run as tasks) put on ``queue``, until cancelled; a producer
    that fails ends it with its error. The producers are cancelled on leaving."""
    tasks = [asyncio.create_task(p) for p in producers]
    getter: asyncio.Future[T] | None = None
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait([getter, *tasks], return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield getter.result()
                continue
            for task in tasks:
                if task.done():
                    task.result()  # raises what ended it
            raise RuntimeError("a watch ended")
    finally:
        for pending in [*tasks, getter]:
            if pending is not None:
                pending.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def raise_if_cancelled() -> None:
    """Raise CancelledError if the current task was asked to stop and something it
    awaited swallowed that (Python 3.11's ``asyncio.wait_for``, used by nats.py, does so
    when its future completes as the cancellation arrives): a loop over a watch calls it
    after each event, so it stops instead of waiting for the next one."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
