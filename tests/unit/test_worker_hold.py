"""The hold after an asked checkpoint: :class:`resurge.worker.hold.Hold` (its deadline on
a clock the test sets), the ``hold_seconds`` of the ``checkpoint_now`` line, and the
CheckpointNow field that carries it (additive: a request without it holds nothing)."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from resurge.events import CheckpointNow, DecodeError, Source, decode_event, encode_event
from resurge.worker import hold as hold_module
from resurge.worker.hold import Hold
from resurge.worker.wire import (
    CheckpointRequest,
    ProtocolError,
    checkpoint_now_line,
    parse_agent_message,
)

SOURCE = Source(service="test", instance="here:1")


class Clock:
    """``time.monotonic`` for :mod:`resurge.worker.hold`, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(hold_module, "time", SimpleNamespace(monotonic=clock))
    return clock


def test_without_an_ask_it_does_not_hold(clock: Clock) -> None:
    hold = Hold()
    assert hold.wait() is None
    hold.ask(0)
    hold.ask(-1)
    assert hold.wait() is None


def test_a_deadline_passed_before_the_wait_holds_nothing(clock: Clock) -> None:
    hold = Hold()
    hold.ask(30)
    clock.now += 30
    assert hold.wait() is None


def test_a_release_before_the_wait_disarms_it(clock: Clock) -> None:
    hold = Hold()
    hold.ask(30)
    hold.release()
    assert hold.wait() is None


def test_one_ask_holds_one_wait(clock: Clock) -> None:
    hold = Hold()
    hold.ask(0.01)  # real seconds for the wait itself
    held = hold.wait()
    assert held is not None and held[0] == pytest.approx(0.01) and held[1] is False
    assert hold.wait() is None


def test_a_later_ask_keeps_the_later_deadline(clock: Clock) -> None:
    hold = Hold()
    hold.ask(0.05)
    clock.now += 0.04
    hold.ask(0.01)  # ends before the first: the first's deadline stays
    held = hold.wait()
    assert held is not None and held[0] == pytest.approx(0.01)
    hold.ask(0.01)
    clock.now += 0.005
    hold.ask(0.02)  # ends after the first: it takes over
    held = hold.wait()
    assert held is not None and held[0] == pytest.approx(0.02)


def test_a_release_ends_a_wait_from_another_thread(clock: Clock) -> None:
    hold = Hold()
    hold.ask(60)
    began = threading.Event()
    results: list[tuple[float, bool] | None] = []
    waiter = threading.Thread(target=lambda: results.append(hold.wait(lambda _: began.set())))
    waiter.start()
    assert began.wait(20)
    assert hold.holding
    hold.ask(600)  # while it holds: does not extend it, nor arm another
    hold.release()
    waiter.join(20)
    assert results == [(60.0, True)]
    assert not hold.holding
    assert hold.wait() is None


def test_the_line_carries_hold_seconds_only_when_set() -> None:
    line = checkpoint_now_line(3, "node warning", 45)
    assert json.loads(line)["hold_seconds"] == 45.0
    assert parse_agent_message(line) == CheckpointRequest(3, "node warning", 45.0)
    plain = checkpoint_now_line(3, "resize 2 -> 4")
    assert plain == checkpoint_now_line(3, "resize 2 -> 4", 0)
    assert "hold_seconds" not in json.loads(plain)
    assert parse_agent_message(plain) == CheckpointRequest(3, "resize 2 -> 4", 0.0)


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), True, "45"])
def test_a_bad_hold_is_refused_on_both_ends(value: object) -> None:
    with pytest.raises(ValueError, match="hold_seconds"):
        checkpoint_now_line(3, "x", value)  # type: ignore[arg-type]
    line = json.dumps(
        {"type": "checkpoint_now", "generation": 3, "reason": "x", "hold_seconds": value}
    )
    with pytest.raises(ProtocolError) as refused:
        parse_agent_message(line.encode())
    assert refused.value.reason in ("bad_field", "not_json")


def test_checkpoint_now_holds_nothing_unless_asked() -> None:
    asked = CheckpointNow(source=SOURCE, job="j", replica=0, generation=2, hold_seconds=45)
    back = decode_event(encode_event(asked))
    assert isinstance(back, CheckpointNow) and back.hold_seconds == 45
    payload = json.loads(encode_event(asked))
    del payload["hold_seconds"]  # as a publisher without the field sends it
    older = decode_event(json.dumps(payload).encode())
    assert isinstance(older, CheckpointNow) and older.hold_seconds == 0
    payload["hold_seconds"] = -1
    with pytest.raises(DecodeError):
        decode_event(json.dumps(payload).encode())
