"""The detector's clock: monotonic time that stands still while the bus is down.

Silence-based detectors (hang, heartbeats, lost nodes) judge deadlines against the
detector's own clock (``ctx.now``). While the detector's NATS connection is down
nothing can arrive, so that silence says nothing about the workers; and just after it
is back, the agents are still sending what they kept meanwhile. So the clock stops
when the connection goes down (:meth:`ConnectedClock.disconnected`), and starts again
``grace`` seconds after it came back (:meth:`ConnectedClock.reconnected`), from where
it stopped: a deadline never counts an outage, nor the grace after it. A connection
that drops again within the grace keeps the clock stopped.

Elapsed time is measured on a monotonic source (``CLOCK_MONOTONIC``,
:func:`time.monotonic`), never on the wall clock: a wall-clock step (NTP, an operator,
a VM restored from a snapshot) of -30 s or +60 s moves no deadline. The readings are
still datetimes: the wall time when the clock was made, plus the monotonic time
elapsed since, less what was excluded, so evidence reads as a time of day (events
themselves are stamped with the wall time by their envelope). ``CLOCK_MONOTONIC`` and
not ``CLOCK_BOOTTIME``: on Linux the former does not advance while the machine is
suspended, and a suspended detector saw nothing, so its silence must not count.

A paused process or VM whose monotonic clock jumps anyway (a hypervisor pause, a
``SIGSTOP``, an event loop stalled by something else) shows as a gap between two
readings: the service reads the clock every tick (a tenth of a second by default), so a
gap longer than ``pause`` seconds is treated as an outage of the detector itself: it is
excluded and the grace follows it, as after a reconnect, for the backlog that queued
meanwhile to be read before any silence counts.

The clock also stands still while the service holds it (:meth:`ConnectedClock.hold`
until :meth:`ConnectedClock.release`; holds nest): the service holds it while it
writes its state before acking a batch, since its reading of events waits meanwhile
(what arrives is not heard until the write ends), and at a job's new generation that
write may take a second (one entry per replica). It runs again when the last hold is
released, or when a grace or an outage that began meanwhile ends, whichever is later.

It never runs backwards, and runs at the monotonic clock's pace otherwise; it is
behind the wall clock it started at by the time excluded so far
(:attr:`ConnectedClock.excluded_seconds`). Pure logic, no I/O: the service feeds it the
bus's connection changes; both time sources can be given, for tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = ["PAUSE_SECONDS", "RECONNECT_GRACE_SECONDS", "ConnectedClock"]

# After a reconnect the clock stands still this long, for the agents to send their backlog.
RECONNECT_GRACE_SECONDS = 10.0
# A gap this long between two readings is a pause of the detector (see the docstring).
PAUSE_SECONDS = 5.0


def _wall() -> datetime:
    return datetime.now(UTC)


class ConnectedClock:
    """Time that excludes the connection's outages, the detector's own pauses and a
    grace after each (see the module docstring). ``monotonic`` measures elapsed seconds;
    ``wall`` is read once, to place the readings in the day."""

    def __init__(
        self,
        grace_seconds: float = RECONNECT_GRACE_SECONDS,
        wall: Callable[[], datetime] = _wall,
        monotonic: Callable[[], float] = time.monotonic,
        pause_seconds: float | None = PAUSE_SECONDS,
    ) -> None:
        if grace_seconds < 0:
            raise ValueError(f"a grace of {grace_seconds} s is not a duration")
        if pause_seconds is not None and pause_seconds <= 0:
            raise ValueError(f"a pause of {pause_seconds} s is not a duration")
        self.grace = timedelta(seconds=grace_seconds)
        self._grace = grace_seconds
        self.pause = pause_seconds
        self.monotonic = monotonic
        self._start = monotonic()
        self._start_wall = wall()
        self._last = self._start  # the latest reading of the monotonic source
        self._excluded = 0.0
        self._stopped_at: float | None = None  # monotonic time the clock stopped
        self._until: float | None = None  # monotonic time it runs again (None: not known)
        self._down = False  # the connection is down (told, and not told back since)
        self._holds = 0  # holds not released yet

    @property
    def stopped(self) -> bool:
        """Whether the clock stands still now."""
        self._settle(self._read())
        return self._stopped_at is not None

    @property
    def excluded_seconds(self) -> float:
        """Seconds excluded so far (outages, pauses and graces; the current one up to now)."""
        mono = self._read()
        self._settle(mono)
        current = mono - self._stopped_at if self._stopped_at is not None else 0.0
        return self._excluded + current

    def disconnected(self) -> None:
        """The connection went down: the clock stops (it stays stopped if it was)."""
        mono = self._read()
        self._settle(mono)
        if self._stopped_at is None:
            self._stopped_at = mono
        self._until = None
        self._down = True

    def reconnected(self) -> None:
        """The connection is back: the clock runs again after the grace."""
        mono = self._read()
        self._settle(mono)
        if self._stopped_at is not None:
            self._until = mono + self._grace
        self._down = False

    def hold(self) -> None:
        """The service stopped hearing events: the clock stands still until released."""
        mono = self._read()
        self._settle(mono)
        self._holds += 1
        if self._stopped_at is None:
            self._stopped_at = self._until = mono

    def release(self) -> None:
        """A :meth:`hold` ends: with none left, the clock runs again (after a grace or
        an outage that is still on)."""
        if self._holds <= 0:
            raise RuntimeError("the detector's clock was released more often than held")
        mono = self._read()
        self._holds -= 1
        if self._holds == 0 and self._until is not None:
            self._until = max(self._until, mono)
        self._settle(mono)

    def connection_changed(self, connected: bool) -> None:
        """:meth:`reconnected` or :meth:`disconnected`: the bus's listener."""
        if connected:
            self.reconnected()
        else:
            self.disconnected()

    def now(self) -> datetime:
        """The time now, on this clock."""
        mono = self._read()
        self._settle(mono)
        at = mono if self._stopped_at is None else self._stopped_at
        return self._start_wall + timedelta(seconds=at - self._start - self._excluded)

    def _read(self) -> float:
        """The monotonic source now; a gap since the last reading longer than the pause
        limit stops the clock where that gap began, until a grace after now (or, while
        the connection is down, until a grace after it is back)."""
        mono = max(self.monotonic(), self._last)
        if self.pause is not None and mono - self._last > self.pause:
            self._settle(self._last)
            if self._stopped_at is None:
                self._stopped_at = self._last
            if not self._down:
                self._until = max(self._until or mono, mono + self._grace)
        self._last = mono
        return mono

    def _settle(self, mono: float) -> None:
        """End a stop whose grace has passed by ``mono`` (and that no hold keeps)."""
        if (
            self._stopped_at is not None
            and self._until is not None
            and not self._holds
            and mono >= self._until
        ):
            self._excluded += self._until - self._stopped_at
            self._stopped_at = self._until = None
