"""A job's history read back from the durable streams, and ``resurge events`` printing it.

A real nats-server; the events are published as the services would publish them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from resurge.cli.events import show_events
from resurge.control.views.history import read_history
from resurge.events import (
    FaultDetected,
    FaultScope,
    GpuSample,
    PhaseChanged,
    Progress,
    RecoveryFinished,
    RecoveryLevel,
)
from resurge.events.envelope import Envelope
from resurge.runtime.bus import Bus


def _at(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=600) + timedelta(seconds=seconds)


async def _story(bus: Bus, job: str) -> list[Envelope]:
    """A job's life as the services tell it: running, steps, a crash, a recovery."""
    s = bus.subjects
    where = {"source": bus.source, "job": job, "node": "node-1", "replica": 0, "generation": 0}
    events: list[tuple[str, Envelope]] = [
        (s.action(job), PhaseChanged(phase="Running", time=_at(0), **where)),
        *[
            (
                s.raw(job, "progress", "node-1"),
                Progress(rank=0, local_rank=0, step=step, time=_at(step), **where),
            )
            for step in range(1, 6)
        ],
        (
            s.fault(job, "process"),
            FaultDetected(
                fault_id=f"crash:{job}",
                scope=FaultScope.PROCESS,
                reason="process_crash",
                message="rank 1 was killed by SIGKILL",
                suggested_level=RecoveryLevel.PROCESS,
                time=_at(10),
                **where,
            ),
        ),
        (
            s.action(job),
            RecoveryFinished(
                fault_id=f"crash:{job}",
                level=RecoveryLevel.PROCESS,
                reason="process_crash",
                duration_seconds=0.31,
                time=_at(11),
                **where,
            ),
        ),
    ]
    for subject, event in reversed(events):  # stored out of order: read back sorted
        await bus.publish(subject, event)
    return [event for _, event in events]


async def test_a_jobs_history_comes_back_in_time_order_and_only_its_own(bus: Bus) -> None:
    told = await _story(bus, "alpha")
    await _story(bus, "beta")
    sample = GpuSample(source=bus.source, node="node-1", gpus=[])
    await bus.publish(bus.subjects.raw("alpha", "gpu_sample", "node-1"), sample)

    history = await read_history(bus, job="alpha")

    assert [stored.event.id for stored in history.events] == [event.id for event in told]
    assert history.skipped == 0


async def test_since_leaves_older_events_out(bus: Bus) -> None:
    await _story(bus, "alpha")
    history = await read_history(bus, job="alpha", since=_at(9.5))
    assert [stored.event.kind for stored in history.events] == [
        "fault_detected",
        "recovery_finished",
    ]


async def test_an_undecodable_stored_message_is_skipped_and_counted(bus: Bus) -> None:
    await _story(bus, "alpha")
    await bus.js.publish(bus.subjects.fault("alpha", "process"), b"{not json")
    history = await read_history(bus, job="alpha")
    assert history.skipped == 1 and len(history.events) == 8


def _args(**given: object) -> argparse.Namespace:
    defaults = {
        "filter": None,
        "job": None,
        "since": None,
        "follow": False,
        "verbose": False,
        "json": False,
        "every": 2,
    }
    return argparse.Namespace(**{**defaults, **given})


async def test_events_prints_one_readable_line_per_event_with_node_and_job(
    bus: Bus, capsys: pytest.CaptureFixture[str]
) -> None:
    await _story(bus, "alpha")
    assert await show_events(bus, _args(job="alpha")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(None, 4)[4] for line in lines] == [
        "phase Running",
        "step 2",
        "step 4",
        "fault process_crash (process, suggests process): rank 1 was killed by SIGKILL",
        "recovered from process_crash at process level in 0.31 s",
    ]
    assert all(line.split()[2:4] == ["alpha", "node-1"] for line in lines)


async def test_follow_prints_the_history_then_new_events_once_each(bus: Bus) -> None:
    await _story(bus, "alpha")
    lines: list[str] = []
    history_printed, finished = asyncio.Event(), asyncio.Event()

    def write(line: str) -> None:
        lines.append(line)
        if "recovered from" in line:
            history_printed.set()
        if "Succeeded" in line:
            finished.set()

    following = asyncio.create_task(show_events(bus, _args(job="alpha", follow=True), write))
    async with asyncio.timeout(20):
        await history_printed.wait()
        done = PhaseChanged(source=bus.source, job="alpha", node="node-1", phase="Succeeded")
        await bus.publish(bus.subjects.action("alpha"), done)
        await finished.wait()
    following.cancel()
    with pytest.raises(asyncio.CancelledError):
        await following
    assert sum("Succeeded" in line for line in lines) == 1
    assert len(lines) == 6


async def test_follow_ends_quietly_when_its_reader_goes_away(bus: Bus) -> None:
    await _story(bus, "alpha")
    resurge = Path(sys.executable).parent / "resurge"
    env = {**os.environ, "RESURGE_NATS_URL": bus.settings.nats_url,
           "RESURGE_NAMESPACE": bus.settings.namespace}  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        str(resurge), "events", "--follow", "--job", "alpha", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    first = await asyncio.wait_for(process.stdout.readline(), 30)
    assert b"phase Running" in first
    process.stdout.feed_eof()
    transport = process._transport  # type: ignore[attr-defined]
    transport.get_pipe_transport(1).close()  # the reader goes away, as `| head -1` does
    code = await asyncio.wait_for(process.wait(), 20)  # no further event comes meanwhile
    assert code == 0
    assert await process.stderr.read() == b""
