"""The detector's clock: wall-clock time that stands still while the bus is down.

Silence-based detectors (hang, heartbeats, lost nodes) judge deadlines against the
detector's own clock (``ctx.now``). While the detector's NATS connection is down
nothing can arrive, so that silence says nothing about the workers; and just after it
is back, the agents are still sending what they kept meanwhile. So the clock stops
when the connection goes down (:meth:`ConnectedClock.disconnected`), and starts again
``grace`` seconds after it came back (:meth:`ConnectedClock.reconnected`), from where
it stopped: a deadline never counts an outage, nor the grace after it. A connection
that drops again within the grace keeps the clock stopped.

It never runs backwards, and runs at the wall clock's pace otherwise; it is behind the
wall clock by the time excluded so far (:attr:`ConnectedClock.excluded_seconds`).
Pure logic, no I/O: the service feeds it the bus's connection changes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = ["RECONNECT_GRACE_SECONDS", "ConnectedClock"]

# After a reconnect the clock stands still this long, for the agents to send their backlog.
RECONNECT_GRACE_SECONDS = 10.0


def _wall() -> datetime:
    return datetime.now(UTC)


class ConnectedClock:
    """Time that excludes the connection's outages and a grace after each (see the
    module docstring). ``wall`` is the clock it follows (the system's, in UTC)."""

    def __init__(
        self,
        grace_seconds: float = RECONNECT_GRACE_SECONDS,
        wall: Callable[[], datetime] = _wall,
    ) -> None:
        if grace_seconds < 0:
            raise ValueError(f"a grace of {grace_seconds} s is not a duration")
        self.grace = timedelta(seconds=grace_seconds)
        self.wall = wall
        self._excluded = timedelta()
        self._stopped_at: datetime | None = None  # wall time the clock stopped
        self._until: datetime | None = None  # wall time it runs again (None: not known)

    @property
    def stopped(self) -> bool:
        """Whether the clock stands still now."""
        self._settle(self.wall())
        return self._stopped_at is not None

    @property
    def excluded_seconds(self) -> float:
        """Seconds excluded so far (outages and graces; the current one up to now)."""
        wall = self.wall()
        self._settle(wall)
        current = wall - self._stopped_at if self._stopped_at is not None else timedelta()
        return (self._excluded + current).total_seconds()

    def disconnected(self) -> None:
        """The connection went down: the clock stops (it stays stopped if it was)."""
        wall = self.wall()
        self._settle(wall)
        if self._stopped_at is None:
            self._stopped_at = wall
        self._until = None

    def reconnected(self) -> None:
        """The connection is back: the clock runs again after the grace."""
        wall = self.wall()
        self._settle(wall)
        if self._stopped_at is not None:
            self._until = wall + self.grace

    def connection_changed(self, connected: bool) -> None:
        """:meth:`reconnected` or :meth:`disconnected`: the bus's listener."""
        if connected:
            self.reconnected()
        else:
            self.disconnected()

    def now(self) -> datetime:
        """The time now, on this clock."""
        wall = self.wall()
        self._settle(wall)
        if self._stopped_at is not None:
            return self._stopped_at - self._excluded
        return wall - self._excluded

    def _settle(self, wall: datetime) -> None:
        """End a stop whose grace has passed by ``wall``."""
        if self._stopped_at is not None and self._until is not None and wall >= self._until:
            self._excluded += self._until - self._stopped_at
            self._stopped_at = self._until = None
