"""Deadlines on one clock: a keyed set of waits, each judged against a limit.

A detector arms a key when a wait begins (``arm(key, since, what)``: since when, and
for what, e.g. ``startup`` or ``heartbeat``), arms it again when the awaited sign comes
(the next wait begins), and disarms it when nothing is awaited any more. The limit is
asked for when the deadline is judged, not stored, because it may change meanwhile
(a job's spec edited live, a timeout learned from what was seen).

A wait has expired when it lasted longer than its limit, or, for a set made with
``at_limit=True``, as long as its limit. Every time is the detector's own clock when
it saw the event (``ctx.now``), never an agent's, so clock skew between nodes does not
move a deadline; that clock measures elapsed time monotonically
(:mod:`resurge_detector.connected_clock`), so neither does a step of the wall clock.
A deadline is never stored across processes: a restarted detector arms it again from
its own start (see the hang and log-rule detectors). Pure logic, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, NamedTuple, TypeVar

__all__ = ["Deadlines", "Expired", "Wait"]

K = TypeVar("K", bound=Hashable)

Limit = Callable[[str], float | None]
"""Seconds a wait for ``what`` may last; None: it has no limit now."""


class Wait(NamedTuple):
    """An armed deadline: waiting since ``since`` for ``what`` (made on every arming)."""

    since: datetime
    what: str


@dataclass(frozen=True)
class Expired(Generic[K]):
    """A wait that outlasted its limit when judged."""

    key: K
    what: str
    since: datetime
    limit: float
    waited: float


class Deadlines(Generic[K]):
    """A keyed set of deadlines on one clock (see the module docstring)."""

    def __init__(self, *, at_limit: bool = False) -> None:
        self.at_limit = at_limit
        self._waits: dict[K, Wait] = {}

    def arm(self, key: K, since: datetime, what: str) -> None:
        """``key`` waits since ``since`` for ``what`` (replacing its earlier wait)."""
        self._waits[key] = Wait(since, what)

    def disarm(self, key: K) -> None:
        """``key`` waits for nothing; a key not armed is fine."""
        self._waits.pop(key, None)

    def get(self, key: K) -> Wait | None:
        """``key``'s wait, or None when it is not armed."""
        return self._waits.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._waits

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._waits))

    def __len__(self) -> int:
        return len(self._waits)

    def check(self, key: K, now: datetime, limit: Limit) -> Expired[K] | None:
        """``key``'s wait if, at ``now``, it outlasted ``limit(what)``; else None."""
        wait = self._waits.get(key)
        return None if wait is None else self._judge(key, wait, limit(wait.what), now)

    def expired(self, now: datetime, limit: Callable[[K, str], float | None]) -> list[Expired[K]]:
        """Every wait that, at ``now``, outlasted ``limit(key, what)``, in arming order."""
        out = []
        for key, wait in list(self._waits.items()):
            found = self._judge(key, wait, limit(key, wait.what), now)
            if found is not None:
                out.append(found)
        return out

    def _judge(self, key: K, wait: Wait, seconds: float | None, now: datetime) -> Expired[K] | None:
        if seconds is None:
            return None
        waited = (now - wait.since).total_seconds()
        over = waited >= seconds if self.at_limit else waited > seconds
        return Expired(key, wait.what, wait.since, seconds, waited) if over else None
