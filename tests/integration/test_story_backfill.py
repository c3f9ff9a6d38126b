"""A story (resurge.local.story) misses nothing the durable streams hold: what its live
subscriptions did not deliver is read back from the streams once the job is over."""

from __future__ import annotations

from resurge.events import RecoveryFinished, RecoveryLevel
from resurge.local.story import Watch, _backfill
from resurge.runtime.bus import Bus

JOB = "j-backfill"


async def test_an_event_the_live_subscription_missed_is_read_back_once(bus: Bus) -> None:
    await bus.ensure_streams()
    finished = RecoveryFinished(
        source=bus.source, job=JOB, fault_id="f1", level=RecoveryLevel.PROCESS,
        duration_seconds=0.3,
    )  # fmt: skip
    other = finished.model_copy(update={"job": "another", "id": "other-id"})
    await bus.publish(bus.subjects.action(JOB), finished)  # stored; nobody listened
    await bus.publish(bus.subjects.action("another"), other)
    watch = Watch()
    await _backfill(bus, JOB, watch)
    await _backfill(bus, JOB, watch)  # twice: still once
    assert [(o.subject, o.event.id) for o in watch.observed] == [
        (bus.subjects.action(JOB), finished.id)
    ]
