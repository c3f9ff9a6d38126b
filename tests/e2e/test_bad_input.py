"""Garbage on every subject a service reads is dead-lettered, and the loop still works."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from resurge.bus import Bus
from resurge.events import (
    AgentState,
    AgentStateChanged,
    DeadLetter,
    DeadLetterReason,
    JobPhase,
    LogLine,
    decode_event,
    encode_event,
)
from resurge.jobspec import load_job
from resurge.local.story import run_job

REPO = Path(__file__).resolve().parents[2]
JOB = "crash-once"

pytestmark = pytest.mark.e2e


async def agents_waiting(bus: Bus, count: int) -> None:
    """Until ``count`` agents said they wait for commands (their consumers are bound).

    Reads the raw stream from its start, so states published earlier count too.
    """
    waiting: set[int | None] = set()
    enough = asyncio.Event()

    async def on_message(msg: Msg) -> None:
        event = decode_event(msg.data)
        if isinstance(event, AgentStateChanged) and event.state is AgentState.WAITING:
            waiting.add(event.replica)
            if len(waiting) >= count:
                enough.set()

    sub = await bus.js.subscribe(
        bus.subjects.raw(JOB, "agent_state", None), cb=on_message, ordered_consumer=True
    )
    try:
        await asyncio.wait_for(enough.wait(), 30)
    finally:
        await sub.unsubscribe()


def consumed_subjects(bus: Bus) -> dict[str, str]:
    """Each subject a service consumes (made concrete for this job) -> that service."""
    s = bus.subjects
    return {
        s.raw(JOB, "process_exited", "node-a"): "detector",
        s.raw(JOB, "process_started", "node-a"): "restarter",
        s.fault(JOB, "process"): "restarter",
        s.job(JOB): "scaler",
        s.cmd(JOB, 0): "node-agent",
        s.cmd(JOB, 1): "node-agent",
    }


def bad_payloads(bus: Bus, subject: str) -> list[bytes]:
    kind = subject.split(".")[4] if ".raw." in subject else "fault_detected"
    unexpected = LogLine(source=bus.source, job=JOB, local_rank=0, stream="stdout", line="hi")
    return [
        b"\x00\x9f not json at all",
        json.dumps({"kind": kind, "pid": "not a number"}).encode(),
        json.dumps({"kind": "from_the_future", "id": "x"}).encode(),
        encode_event(unexpected),
    ]


async def test_services_dead_letter_garbage_and_still_recover_a_real_fault(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    async def publish_garbage(bus: Bus) -> None:
        await agents_waiting(bus, count=2)
        for subject in consumed_subjects(bus):
            for payload in bad_payloads(bus, subject):
                await bus.nc.publish(subject, payload)
        await bus.nc.flush()

    job = load_job(REPO / "examples" / "crash_once" / "job.yaml")
    result = await run_job(
        job,
        state_dir=tmp_path,
        nats_url=nats_url,
        namespace=namespace,
        nodes=["node-a", "node-b"],
        cwd=REPO,
        wait_seconds=60,
        before_submit=publish_garbage,
    )

    assert result.phase is JobPhase.SUCCEEDED
    assert len(result.recoveries) == 1
    assert all(result.services_alive.values()), result.services_alive
    assert set(result.services_alive) == {"detector", "restarter", "scaler"}

    letters = [o.event for o in result.observed if isinstance(o.event, DeadLetter)]
    per_service = Counter(letter.source.service for letter in letters)
    assert per_service["detector"] == 4
    assert per_service["restarter"] == 8
    assert per_service["scaler"] == 4
    assert per_service["node-agent"] == 8
    reasons = {letter.reason for letter in letters if letter.source.service != "story"}
    assert reasons == set(DeadLetterReason)
    assert all(letter.payload_bytes > 0 and letter.detail for letter in letters)
