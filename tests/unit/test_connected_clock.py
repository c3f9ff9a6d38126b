"""The detector's clock stands still while the bus is down and for a grace after it,
so a deadline never counts an outage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from resurge_detector.connected_clock import ConnectedClock
from resurge_detector.deadlines import Deadlines

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Wall:
    """A wall clock moved by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def pass_(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def wall() -> Wall:
    return Wall()


@pytest.fixture
def clock(wall: Wall) -> ConnectedClock:
    return ConnectedClock(grace_seconds=5.0, wall=wall)


def test_connected_it_is_the_wall_clock(clock: ConnectedClock, wall: Wall) -> None:
    assert clock.now() == T0
    wall.pass_(7)
    assert clock.now() == at(7) and not clock.stopped and clock.excluded_seconds == 0


def test_it_stands_still_while_down_and_for_the_grace_then_goes_on_from_there(
    clock: ConnectedClock, wall: Wall
) -> None:
    wall.pass_(10)
    clock.connection_changed(False)
    wall.pass_(30)  # the outage
    assert clock.now() == at(10) and clock.stopped
    clock.connection_changed(True)
    wall.pass_(4.9)  # within the grace
    assert clock.now() == at(10) and clock.stopped
    wall.pass_(0.1)
    assert clock.now() == at(10) and not clock.stopped  # the grace is over: runs again
    wall.pass_(2)
    assert clock.now() == at(12)
    assert clock.excluded_seconds == 35  # 30 s down and 5 s of grace


def test_a_drop_within_the_grace_keeps_it_stopped_and_outages_add_up(
    clock: ConnectedClock, wall: Wall
) -> None:
    clock.disconnected()
    wall.pass_(3)
    clock.reconnected()
    wall.pass_(2)
    clock.disconnected()  # again, before the grace ended
    wall.pass_(10)
    assert clock.now() == T0
    clock.reconnected()
    wall.pass_(5)
    assert clock.now() == T0 and clock.excluded_seconds == 20
    wall.pass_(1)
    assert clock.now() == at(1)
    clock.disconnected()  # a second outage, after the clock ran again
    wall.pass_(4)
    clock.disconnected()  # told twice: still one outage
    clock.reconnected()
    clock.reconnected()
    wall.pass_(5)
    assert clock.now() == at(1) and clock.excluded_seconds == 29


def test_back_without_having_been_down_changes_nothing(clock: ConnectedClock, wall: Wall) -> None:
    clock.reconnected()
    wall.pass_(1)
    assert clock.now() == at(1) and not clock.stopped


def test_it_never_runs_backwards(clock: ConnectedClock, wall: Wall) -> None:
    readings = []
    for step, connected in enumerate([False, True, False, None, True, None, None, False, True]):
        if connected is not None:
            clock.connection_changed(connected)
        readings.append(clock.now())
        wall.pass_(1.5 + step % 3)
        readings.append(clock.now())
    assert readings == sorted(readings)


def test_a_deadline_does_not_expire_for_the_outage(clock: ConnectedClock, wall: Wall) -> None:
    """A heartbeat wait of 10 s: the last beat came 4 s before the bus went down for a
    minute; the agents' backlog (a beat from during the outage) is in within the grace."""
    deadlines: Deadlines[str] = Deadlines()
    deadlines.arm("rank 0", clock.now(), "heartbeat")
    wall.pass_(4)
    clock.disconnected()
    wall.pass_(60)
    assert deadlines.expired(clock.now(), lambda key, what: 10.0) == []
    clock.reconnected()
    deadlines.arm("rank 0", clock.now(), "heartbeat")  # the backlog's beat
    wall.pass_(13)  # 5 s of grace, then 8 s
    assert deadlines.expired(clock.now(), lambda key, what: 10.0) == []
    wall.pass_(3)  # silence after the outage still counts
    [expired] = deadlines.expired(clock.now(), lambda key, what: 10.0)
    assert expired.key == "rank 0" and expired.waited == 11


def test_a_negative_grace_is_refused() -> None:
    with pytest.raises(ValueError):
        ConnectedClock(grace_seconds=-1)
