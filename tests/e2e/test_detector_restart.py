"""The detector SIGKILLed while a hang is under way still catches it: a plain script (no
resurge import) prints its steps under a 3 s log rule, then hangs in Python; once the
detector has acknowledged its last line it is SIGKILLed, and the local cluster starts it
again. The restarted detector arms the rule's wait again (its durable state) and the
hang is a fault a limit after the restart; before, nothing came at all (no later event
armed the wait), and the job hung until something else killed it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import nats.js.errors
import pytest

from resurge.events import Event, FaultDetected, LogLine
from resurge.local.job_factory import python_job
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus
from tests.collect import Events

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).parent / "workers" / "prints_then_hangs.py"
LIMIT = 3.0
RULE = {"name": "steps", "logPattern": r"step \d+", "expectedRecurringFrequencyInSeconds": LIMIT}


def hanging(lines: list[Event]) -> LogLine | None:
    for event in lines:
        if isinstance(event, LogLine) and event.line == "hanging" and event.generation == 0:
            return event
    return None


def hang_fault(seen: list[Observed]) -> bool:
    return any(isinstance(o.event, FaultDetected) and o.event.generation == 0 for o in seen)


async def acknowledged(bus: Bus, event: LogLine) -> None:
    """Until the detector's raw consumer has acknowledged ``event`` (polled, bounded)."""
    stream = bus.subjects.stream("raw")
    subject = bus.subjects.raw(event.job, "log_line", event.node)
    async with asyncio.timeout(30):
        while True:
            # A core subscriber may see the line before the stream stored it.
            with contextlib.suppress(nats.js.errors.NotFoundError):
                last = await bus.js.get_last_msg(stream, subject)
                if last.data and event.id.encode() in last.data:
                    break
            await asyncio.sleep(0.05)
        while True:
            info = await bus.js.consumer_info(stream, "detector")
            if info.ack_floor is not None and info.ack_floor.stream_seq >= last.seq:
                break
            await asyncio.sleep(0.05)


async def test_a_hang_under_way_is_caught_after_the_detector_is_sigkilled(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = python_job(
        "hangs-across-restart",
        SCRIPT,
        monitoring={"logRules": [RULE]},
        recovery={"stopGraceSeconds": 1},
    )
    killed: dict[str, float] = {}
    lines = Events()  # the story does not record log lines

    async def read_lines(bus: Bus) -> None:
        await bus.subscribe(bus.subjects.raw(job.name, "log_line", None), lines.add)
        await bus.nc.flush()

    async def kill_detector_during_the_hang(bus: Bus, watch: Watch) -> None:
        line = await lines.wait_for(hanging, 60)
        await acknowledged(bus, line)
        assert watch.supervisor is not None
        detector = watch.supervisor.children["detector"].process
        assert detector is not None
        os.kill(detector.pid, signal.SIGKILL)
        killed["at"] = time.time()
        await watch.wait_for(hang_fault, 30)

    result = await run_job(job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=1, gpus_per_node=1, wait_seconds=90, end_with_during=True,
                           before_submit=read_lines,
                           during=kill_detector_during_the_hang)  # fmt: skip
    assert result.service_restarts["detector"] == 1
    [fault] = [f for f in result.faults if f.generation == 0]
    assert (fault.reason, fault.rank, fault.evidence["rule"]) == ("log_hang", 0, "steps")
    # A whole limit after the kill at least (its wait counts from the restart), and
    # no longer than the restart (backoff and start-up) and the limit take.
    after_kill = fault.time.timestamp() - killed["at"]
    assert LIMIT <= after_kill <= LIMIT + 12, after_kill
