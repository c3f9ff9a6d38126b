"""Holding a worker after the checkpoint it was asked for, until the move that asked comes.

A checkpoint request that precedes a stop (a node's jobs moved off it: a warning sign, a
quarantine, a drain) carries ``hold_seconds``. The worker saves and reports the
checkpoint as for any request; then, instead of training on (steps the job, resumed from
that checkpoint, would train again), it holds in :meth:`WorkerRun.checkpoint_saved
<resurge.worker.WorkerRun.checkpoint_saved>`, where no collective is in flight, until:

- it is stopped: the stop's SIGTERM ends the process (its default action, or a handler
  that raises, e.g. SystemExit); a handler that returns leaves it held, its checkpoint
  saved, until the hold's end or the stop's SIGKILL;
- an in-process restart comes (``restart``): the hold ends and the restart's exception
  is raised in the training function as anywhere else;
- or ``hold_seconds`` have passed since the request arrived: the move never came, and it
  trains on.

A stop notice (``stop_pending``) does not end a hold: the stop it announces does. The
hold answers the first checkpoint reported after the request arrived, and only until
the request's deadline: a rank whose peers saved without it (the request reached it
later) holds at its next checkpoint report only if that deadline is still ahead. A new
generation (an in-process restart) drops a hold not yet begun.

:class:`Hold` is thread-safe: :meth:`Hold.ask` and :meth:`Hold.release` come from the
link thread, :meth:`Hold.wait` runs in the training thread. The wait blocks in one
``lock.acquire(timeout)`` (signals interrupt it, so a SIGTERM handler runs), so an
exception raised into the thread by :mod:`resurge.worker.interrupt` lands as soon as
:meth:`Hold.release` wakes it, in this module's frame and not inside a library's lock.
"""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Callable

__all__ = ["Hold"]


class Hold:
    """One worker's hold: asked (armed with a deadline), waited in, released."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadline: float | None = None  # asked, not yet waited in
        self._gate: _thread.LockType | None = None  # locked while a wait runs

    @property
    def holding(self) -> bool:
        """Whether a wait runs now."""
        return self._gate is not None

    def ask(self, seconds: float) -> None:
        """Arm a hold that ends ``seconds`` from now (<= 0: nothing); a later ask while
        one is armed keeps the later deadline; while a wait runs, it is not extended."""
        if seconds <= 0:
            return
        deadline = time.monotonic() + seconds
        with self._lock:
            if self._gate is None:
                self._deadline = max(deadline, self._deadline or deadline)

    def wait(self, on_hold: Callable[[float], None] | None = None) -> tuple[float, bool] | None:
        """If a hold is armed and its deadline ahead, block until it is released or the
        deadline passes; ``(seconds it would hold, released)``, or None if it did not
        hold. Disarms the hold either way. ``on_hold(seconds)`` runs as it begins."""
        with self._lock:
            deadline, self._deadline = self._deadline, None
            seconds = 0.0 if deadline is None else deadline - time.monotonic()
            if seconds <= 0:
                return None
            gate = _thread.allocate_lock()
            gate.acquire()
            self._gate = gate
        if on_hold is not None:
            on_hold(seconds)
        released = gate.acquire(timeout=seconds)
        with self._lock:
            if self._gate is gate:
                self._gate = None
        return seconds, released

    def release(self) -> None:
        """End a wait that runs, and disarm a hold not yet waited in."""
        with self._lock:
            self._deadline = None
            gate, self._gate = self._gate, None
        if gate is not None:
            gate.release()  # locked until now: only the wait takes it, only this releases it
