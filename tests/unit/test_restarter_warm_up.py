"""The restarter's warm-up decides a made-up fault and builds its commands, sending none.

No bus is needed: what the warm-up reads of one is its source and subjects, given here
as a stand-in (it never publishes, which is what this checks by giving it nothing to
publish with).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from resurge.contract.subjects import Subjects
from resurge.events import Assign, PhaseChanged, Source, Stop
from resurge.runtime.bus import Bus
from resurge_restarter.warm_up import warm_up


def test_warm_up_builds_a_process_restart_and_sends_nothing() -> None:
    bus = cast(
        Bus,
        SimpleNamespace(
            source=Source(service="restarter", instance="here:1"), subjects=Subjects("warm")
        ),
    )
    messages = warm_up(bus, "here:1")
    stops = [m for _, m in messages if isinstance(m, Stop)]
    assigns = [m for _, m in messages if isinstance(m, Assign)]
    assert sorted(s.replica for s in stops if s.replica is not None) == [0, 1]
    assert [(a.replica, a.generation) for a in assigns] == [(0, 1), (1, 1)]
    assert any(isinstance(m, PhaseChanged) for _, m in messages)
    assert all(subject.startswith("warm.") for subject, _ in messages)
