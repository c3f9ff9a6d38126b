"""Raise an exception in one thread from another, only while it runs a guarded call.

:class:`Interrupter` is made in the thread to interrupt. :meth:`Interrupter.call` runs
a function there with interrupts armed; :meth:`Interrupter.interrupt` (any thread)
asks CPython (``PyThreadState_SetAsyncExc``) to raise an exception type in that
thread at its next bytecode boundary, and returns False when no guarded call is
running. Once the guarded call has returned or raised, an interrupt that had not
landed yet is withdrawn, and one that lands in that instant is swallowed, so an
interrupt never escapes the guard into the caller's code.

A thread blocked in a C call (``time.sleep``, a collective waiting for a peer) gets
the exception only when that call returns. CPython only: ``ctypes.pythonapi``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["Interrupter"]

P = ParamSpec("P")
R = TypeVar("R")


def _set_async_exc(thread_id: int, kind: type[BaseException] | None) -> None:
    """Make ``kind`` pending in the thread (None: withdraw what is pending)."""
    exc = ctypes.py_object(kind) if kind is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc)


class Interrupter:
    """Interrupts the thread that made it, only while :meth:`call` runs there."""

    def __init__(self) -> None:
        self.thread_id = threading.get_ident()
        self._armed = False
        self._sent: set[type[BaseException]] = set()
        self._lock = threading.Lock()

    @property
    def armed(self) -> bool:
        """Whether a guarded call runs now, so an interrupt would land in it."""
        return self._armed

    def interrupt(self, kind: type[BaseException]) -> bool:
        """Raise ``kind`` in the guarded call if one runs; True if asked to."""
        with self._lock:
            if not self._armed:
                return False
            self._sent.add(kind)
            _set_async_exc(self.thread_id, kind)
            return True

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` in this (the interrupter's) thread, interrupts armed."""
        if threading.get_ident() != self.thread_id:
            raise RuntimeError("Interrupter.call must run in the thread that made it")
        with self._lock:
            self._sent.clear()
            self._armed = True
        try:
            return fn(*args, **kwargs)
        finally:
            # No lock and no call before this store, so nothing can land in between;
            # from here on interrupt() refuses.
            self._armed = False
            while True:
                try:
                    self._withdraw()
                    break
                except BaseException as late:  # landed just before it was withdrawn
                    if type(late) not in self._sent:
                        raise

    def _withdraw(self) -> None:
        # Under the lock: an interrupt() that saw `armed` before the store above has
        # finished setting its exception by now, and none can follow.
        with self._lock:
            _set_async_exc(self.thread_id, None)
