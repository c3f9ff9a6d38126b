"""The detector's clock stands still while the bus is down and for a grace after it,
so a deadline never counts an outage; it measures time on a monotonic source, so a step
of the wall clock moves no deadline, and a pause of the detector counts as an outage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from resurge_detector.connected_clock import ConnectedClock
from resurge_detector.deadlines import Deadlines

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Wall:
    """A machine's two clocks moved by hand: time passing moves both; the wall clock
    can also be stepped alone (NTP, an operator), and the monotonic one jump alone (a
    paused VM whose monotonic clock counts the pause)."""

    def __init__(self) -> None:
        self.now = T0
        self.mono = 1000.0

    def __call__(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def pass_(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        self.mono += seconds

    def step(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def wall() -> Wall:
    return Wall()


@pytest.fixture
def clock(wall: Wall) -> ConnectedClock:
    return ConnectedClock(
        grace_seconds=5.0, wall=wall, monotonic=wall.monotonic, pause_seconds=None
    )


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


def test_it_never_runs_backwards_whatever_the_wall_clock_does(
    clock: ConnectedClock, wall: Wall
) -> None:
    readings = []
    for step, connected in enumerate([False, True, False, None, True, None, None, False, True]):
        if connected is not None:
            clock.connection_changed(connected)
        readings.append(clock.now())
        wall.pass_(1.5 + step % 3)
        wall.step(-30 if step % 2 else 60)  # the wall clock set back, then forward
        readings.append(clock.now())
    assert readings == sorted(readings)


@pytest.mark.parametrize("step", [-30.0, 60.0])
def test_a_wall_clock_step_moves_no_deadline(
    clock: ConnectedClock, wall: Wall, step: float
) -> None:
    """A heartbeat wait of 10 s, the wall clock stepped by ``step`` 4 s in: the wait
    expires 10 s after it began, neither sooner (+60 s: a false hang) nor later (-30 s)."""
    deadlines: Deadlines[str] = Deadlines()
    deadlines.arm("rank 0", clock.now(), "heartbeat")
    wall.pass_(4)
    wall.step(step)
    wall.pass_(5.9)
    assert deadlines.expired(clock.now(), lambda key, what: 10.0) == []
    wall.pass_(0.2)
    [expired] = deadlines.expired(clock.now(), lambda key, what: 10.0)
    assert expired.waited == pytest.approx(10.1)


def ticking(clock: ConnectedClock, wall: Wall, seconds: float) -> None:
    """``seconds`` pass, the clock read every quarter of a second (as the service ticks)."""
    for _ in range(round(seconds * 4)):
        wall.pass_(0.25)
        clock.now()


def test_a_pause_of_the_detector_counts_as_an_outage(wall: Wall) -> None:
    """The monotonic clock jumps 60 s between two readings (a paused VM, SIGSTOP): the
    gap and a grace after it are excluded, as an outage of the bus would be."""
    clock = ConnectedClock(
        grace_seconds=5.0, wall=wall, monotonic=wall.monotonic, pause_seconds=2.0
    )
    deadlines: Deadlines[str] = Deadlines()
    ticking(clock, wall, 1)
    deadlines.arm("rank 0", clock.now(), "heartbeat")
    wall.pass_(60)  # nothing read the clock meanwhile
    assert deadlines.expired(clock.now(), lambda key, what: 10.0) == []
    assert clock.stopped and clock.excluded_seconds == pytest.approx(60)
    ticking(clock, wall, 5)  # the grace, for the backlog
    assert not clock.stopped
    ticking(clock, wall, 9.75)
    assert deadlines.expired(clock.now(), lambda key, what: 10.0) == []
    wall.pass_(0.5)
    [expired] = deadlines.expired(clock.now(), lambda key, what: 10.0)
    assert expired.waited == 10.25
    assert clock.now() == at(1 + 10.25)


def test_a_pause_while_down_ends_with_the_grace_after_the_reconnect(wall: Wall) -> None:
    clock = ConnectedClock(
        grace_seconds=5.0, wall=wall, monotonic=wall.monotonic, pause_seconds=2.0
    )
    wall.pass_(1)
    clock.now()
    clock.disconnected()
    wall.pass_(30)
    assert clock.stopped and clock.now() == at(1)
    clock.reconnected()
    ticking(clock, wall, 5)
    assert not clock.stopped and clock.now() == at(1)
    assert clock.excluded_seconds == 35


def test_readings_a_tick_apart_are_no_pause(wall: Wall) -> None:
    clock = ConnectedClock(grace_seconds=5.0, wall=wall, monotonic=wall.monotonic)
    ticking(clock, wall, 50)
    assert not clock.stopped and clock.now() == at(50)


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


def test_a_negative_grace_or_pause_is_refused() -> None:
    with pytest.raises(ValueError):
        ConnectedClock(grace_seconds=-1)
    with pytest.raises(ValueError):
        ConnectedClock(pause_seconds=0)
