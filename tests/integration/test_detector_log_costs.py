"""Through the detector service on a real nats-server: a job whose log rule is
catastrophic on its lines gets that rule suspended, announced once as an alert on its
fault subject, and another job of the same partition still gets its log fault."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import Event, FaultDetected, FaultScope, JobPhase, LogLine
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.collect import Events

EVIL = {"name": "greedy", "logPattern": "(a+)+$", "faultOnMatch": True}
CUDA = {"name": "cuda", "logPattern": "CUDA error", "faultOnMatch": True}


def record(name: str, rule: dict[str, object]) -> JobRecord:
    return JobRecord(
        name=name,
        spec=job(name, monitoring={"logRules": [rule]}),
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=0, node="n0")],
    )


def line(bus: Bus, name: str, text: str) -> LogLine:
    return LogLine(
        source=bus.source,
        job=name,
        replica=0,
        node="n0",
        rank=0,
        generation=0,
        local_rank=0,
        stream="stdout",
        line=text,
    )


async def test_a_catastrophic_rule_is_suspended_and_announced_and_the_other_job_judged(
    bus: Bus, settings: Settings
) -> None:
    store = JobStore(await bus.jobs_bucket())
    await store.create(record("evil", EVIL))
    await store.create(record("good", CUDA))
    faults = Events()
    await bus.subscribe(bus.subjects.all("fault"), faults.add)
    # Each of these lines costs the rule its whole search bound (20 ms): 300 of them
    # held the detector 6 s or more; its budget is 1 s per 10 s.
    for _ in range(300):
        await bus.publish(
            bus.subjects.raw("evil", "log_line", "n0"), line(bus, "evil", "a" * 4000 + "b")
        )
    await bus.publish(
        bus.subjects.raw("good", "log_line", "n0"), line(bus, "good", "CUDA error: 700")
    )
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_DETECTORS": "log_rules",
    }
    detector = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "resurge_detector", env=env, stderr=subprocess.DEVNULL
    )

    def reasons(items: list[Event]) -> list[tuple[str | None, str]]:
        return [(f.job, f.reason) for f in items if isinstance(f, FaultDetected)]

    try:
        await faults.wait_for(lambda items: len(reasons(items)) >= 2, 60)
    finally:
        detector.terminate()
        await detector.wait()
    assert reasons(faults.items) == [("evil", "log_rule_suspended"), ("good", "log_rule")]
    [alert] = [f for f in faults.items if isinstance(f, FaultDetected) and f.job == "evil"]
    assert alert.alert_only and alert.scope is FaultScope.JOB
    assert alert.evidence["rule"] == "greedy"
