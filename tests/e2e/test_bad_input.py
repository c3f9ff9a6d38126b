"""Garbage on every subject a service reads is dead-lettered, and the loop still works."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from resurge.events import (
    AgentStateChanged,
    DeadLetter,
    DeadLetterReason,
    JobPhase,
    LogLine,
    encode_event,
)
from resurge.local.job_factory import python_job
from resurge.local.story import Watch, run_job
from resurge.runtime.bus import Bus

JOB = "garbage-proof"

pytestmark = pytest.mark.e2e


def service_subjects(bus: Bus) -> dict[str, str]:
    """Subjects control-plane services consume (made concrete); the detector reads every
    raw subject, the restarter also reads process starts and exits."""
    s = bus.subjects
    return {
        s.raw(JOB, "process_exited", "node-0"): "detector",
        s.raw(JOB, "process_started", "node-0"): "restarter",
        s.fault(JOB, "process"): "restarter",
        s.job(JOB): "scaler",
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


async def publish_all(bus: Bus, subjects: list[str]) -> None:
    for subject in subjects:
        for payload in bad_payloads(bus, subject):
            await bus.nc.publish(subject, payload)
    await bus.nc.flush()


async def test_services_dead_letter_garbage_and_still_recover_a_real_fault(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = python_job(
        JOB,
        "-m resurge.local.demo_worker",
        *("--steps", "30", "--crash-rank", "1", "--crash-step", "5"),
        nproc=2,
        replicas=2,
        recovery={"jobMaxRetryCount": 2, "stopGraceSeconds": 2},
        preload=None,
    )

    async def before_submit(bus: Bus) -> None:
        await publish_all(bus, list(service_subjects(bus)))

    async def during(bus: Bus, watch: Watch) -> None:
        # agents exist once the job is placed: garbage their commands as soon as both speak
        await watch.wait_for(
            lambda seen: (
                {o.event.replica for o in seen if isinstance(o.event, AgentStateChanged)} >= {0, 1}
            )
        )
        await publish_all(bus, [bus.subjects.cmd(JOB, 0), bus.subjects.cmd(JOB, 1)])

    result = await run_job(
        job,
        state_dir=tmp_path,
        nats_url=nats_url,
        namespace=namespace,
        nodes=2,
        gpus_per_node=2,
        wait_seconds=60,
        before_submit=before_submit,
        during=during,
    )

    assert result.phase is JobPhase.SUCCEEDED
    assert len(result.recoveries) == 1
    assert result.services_alive == {
        name: True for name in ("detector", "restarter", "scaler", "node-0", "node-1")
    }
    assert set(result.service_restarts.values()) == {0}  # none died and came back

    letters = [o.event for o in result.observed if isinstance(o.event, DeadLetter)]
    per_service = Counter(letter.source.service for letter in letters)
    assert per_service["detector"] == 8  # both raw subjects
    assert per_service["restarter"] == 12  # process starts and exits, faults
    assert per_service["scaler"] == 4
    assert per_service["node-agent"] == 8
    reasons = {letter.reason for letter in letters if letter.source.service != "story"}
    assert reasons == set(DeadLetterReason)
    assert all(letter.payload_bytes > 0 and letter.detail for letter in letters)
