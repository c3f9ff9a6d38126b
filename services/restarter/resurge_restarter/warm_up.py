"""Warming the fault path at start, so the first fault is decided as fast as the next.

A fresh Python process runs each code path slowly the first time (pydantic builds and
caches what it needs on first use, and nothing is in the CPU's caches): a fresh
restarter took about 0.3 ms longer to decide its first fault and about 0.3 ms longer to
build its commands than it took for the next. :func:`warm_up` runs that path once on a
made-up two-replica job, with no I/O: the fault decoded, the decision taken on a copy of
the job's record, the record encoded, and the Stop and Assign commands built and
encoded. Nothing is stored or sent.
"""

from __future__ import annotations

from datetime import UTC, datetime

from resurge.control.decisions.recovery_policy import Verdict, apply_fault
from resurge.control.effects.job_messages import assignment_messages, phase_message, stop_messages
from resurge.control.state.records import JobRecord, Placement
from resurge.events import (
    Envelope,
    FaultDetected,
    FaultScope,
    JobPhase,
    decode_event,
    encode_event,
)
from resurge.jobspec import parse_job
from resurge.runtime.bus import Bus

__all__ = ["warm_up"]

_JOB = "warm-up"


def warm_up(bus: Bus, me: str) -> list[tuple[str, Envelope]]:
    """Decide one made-up process fault and build its commands (returned); nothing is
    sent."""
    spec = parse_job(
        {
            "metadata": {"name": _JOB},
            "spec": {"command": ["x"], "nprocPerNode": 2, "replicas": {"min": 2}},
        }
    )
    record = JobRecord(
        name=_JOB,
        spec=spec,
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=0, node="a"), Placement(replica=1, node="b")],
    )
    fault = FaultDetected(
        source=bus.source,
        job=_JOB,
        replica=1,
        node="b",
        rank=3,
        generation=0,
        fault_id="warm-up",
        scope=FaultScope.PROCESS,
        reason="process_crash",
        evidence={"exited_at": datetime.now(UTC).isoformat()},
    )
    decoded = decode_event(encode_event(fault))
    assert isinstance(decoded, FaultDetected)
    after = record.model_copy(deep=True)
    if (
        apply_fault(after, decoded, now=datetime.now(UTC), claimant=me).verdict
        is not Verdict.RESTART
    ):
        return []
    after.model_dump_json()
    messages = [
        *stop_messages(bus, after, 0, "warm-up"),
        *assignment_messages(bus, after),
    ]
    phase = phase_message(bus, JobPhase.PENDING, after)
    if phase is not None:
        messages.append(phase)
    for _subject, message in messages:
        encode_event(message)
    return messages
