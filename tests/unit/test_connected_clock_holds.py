"""The detector's clock stands still while the service holds it (it writes its state
before acking a batch, and hears no event meanwhile): a rank whose reports wait unread
behind a long write is not silent for the write's time. Holds nest, and combine with
an outage and its grace: the clock runs again when the later of them ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from resurge_detector.connected_clock import ConnectedClock
from resurge_detector.deadlines import Deadlines

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Mono:
    """A monotonic source moved by hand."""

    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def clock_of(mono: Mono, pause_seconds: float | None = None) -> ConnectedClock:
    return ConnectedClock(
        grace_seconds=5.0, wall=lambda: T0, monotonic=mono, pause_seconds=pause_seconds
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_held_clock_stands_still_and_runs_on_from_there_when_released() -> None:
    mono = Mono()
    clock = clock_of(mono)
    mono.now += 1
    clock.hold()
    mono.now += 3
    assert clock.now() == at(1) and clock.stopped
    clock.release()
    assert clock.now() == at(1) and not clock.stopped
    mono.now += 2
    assert clock.now() == at(3) and clock.excluded_seconds == 3


def test_a_heartbeat_wait_does_not_expire_for_a_long_state_write() -> None:
    """A rank reported at 1 s; its next report waits unread behind a 1.5 s write, then
    is read: by the clock, 1.2 s passed, under its 2 s timeout."""
    mono = Mono()
    clock = clock_of(mono)
    waits: Deadlines[int] = Deadlines()
    mono.now += 1
    waits.arm(7, clock.now(), "heartbeat")
    mono.now += 0.2
    clock.hold()
    mono.now += 1.5
    assert waits.expired(clock.now(), lambda _k, _w: 1.0) == []  # the tick, meanwhile
    clock.release()
    assert waits.expired(clock.now(), lambda _k, _w: 2.0) == []
    mono.now += 2.0  # and a real silence still counts, once heard again (2.2 s)
    assert [e.key for e in waits.expired(clock.now(), lambda _k, _w: 2.0)] == [7]


def test_holds_nest() -> None:
    mono = Mono()
    clock = clock_of(mono)
    clock.hold()
    clock.hold()
    mono.now += 1
    clock.release()
    mono.now += 1
    assert clock.now() == at(0)
    clock.release()
    mono.now += 1
    assert clock.now() == at(1) and clock.excluded_seconds == 2


def test_a_hold_and_an_outage_end_with_the_later_of_them() -> None:
    mono = Mono()
    clock = clock_of(mono)
    clock.hold()
    clock.disconnected()
    mono.now += 1
    clock.release()  # still down: stands still
    mono.now += 1
    clock.reconnected()  # then the grace, 5 s
    mono.now += 5
    assert clock.now() == at(0)
    mono.now += 1
    assert clock.now() == at(1)

    clock.disconnected()
    clock.reconnected()  # a grace until 5 s from now
    clock.hold()
    mono.now += 7
    assert clock.now() == at(1)  # the hold outlasts the grace
    clock.release()
    mono.now += 1
    assert clock.now() == at(2)


def test_a_pause_while_held_ends_with_its_grace() -> None:
    mono = Mono()
    clock = clock_of(mono, pause_seconds=2.0)
    clock.hold()
    mono.now += 3  # the loop stalled: a pause, its grace after it
    clock.release()
    for _ in range(4):  # read every second, as the service's tick does
        mono.now += 1
        assert clock.stopped
    mono.now += 1
    assert not clock.stopped and clock.now() == at(0)


def test_a_release_without_a_hold_is_refused() -> None:
    with pytest.raises(RuntimeError, match="released more often than held"):
        clock_of(Mono()).release()
