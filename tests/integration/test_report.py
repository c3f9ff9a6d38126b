"""``resurge report``: a job with two faults and a resize, stored in a real nats-server as
the services store them, written as a PNG and a self-contained HTML page whose data
holds those marks (the data behind the picture is checked, not its pixels)."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from resurge.cli.report import write_report
from resurge.events import (
    Assign,
    FaultDetected,
    FaultScope,
    JobPhase,
    PhaseChanged,
    ProcessExited,
    Progress,
    RecoveryFinished,
    RecoveryLevel,
    RecoveryStarted,
    ReplicaSlot,
    ScaleDecided,
)
from resurge.events.envelope import Envelope
from resurge.runtime.bus import Bus

JOB = "reported"
START = datetime.now(UTC) - timedelta(minutes=5)


def _at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def _assign(bus: Bus, seconds: float, generation: int, world: int) -> Assign:
    return Assign(
        source=bus.source, job=JOB, replica=0, time=_at(seconds), generation=generation,
        world_size=world, master_port=29500, master_addr="127.0.0.1",
        rank_table=[ReplicaSlot(replica=r, node=f"node-{r}", first_rank=r, nproc=1)
                    for r in range(world)],
    )  # fmt: skip


def _fault(bus: Bus, seconds: float, rank: int, generation: int) -> FaultDetected:
    return FaultDetected(
        source=bus.source, job=JOB, rank=rank, node=f"node-{rank}", generation=generation,
        fault_id=f"crash:{JOB}:g{generation}:r{rank}", scope=FaultScope.PROCESS,
        reason="process_crash", message=f"rank {rank} was killed by SIGKILL",
        suggested_level=RecoveryLevel.PROCESS, time=_at(seconds),
    )  # fmt: skip


async def _store(bus: Bus) -> None:
    s, src = bus.subjects, bus.source
    events: list[tuple[str, Envelope]] = [
        (s.action(JOB), PhaseChanged(source=src, job=JOB, phase=JobPhase.RUNNING, time=_at(0))),
        (s.cmd(JOB, 0), _assign(bus, 0, 0, 2)),
    ]
    step_times = [(t, t) for t in range(1, 21)]  # steps 1..20 over 20 s
    step_times += [(t, t - 3) for t in range(22, 30)]  # after fault 1: 19..26 (2 redone)
    step_times += [(t, t - 10) for t in range(33, 60)]  # after fault 2: 23..49 (4 redone)
    for t, step in step_times:
        progress = Progress(source=src, job=JOB, rank=0, local_rank=0, step=step, time=_at(t))
        events.append((s.raw(JOB, "progress", "node-0"), progress))
    for when, rank, generation in ((20.2, 1, 0), (30.1, 0, 1)):
        died = ProcessExited(
            source=src, job=JOB, rank=rank, pid=1, local_rank=0, local_world_size=1,
            exit_code=None, signal="SIGKILL", time=_at(when),
        )  # fmt: skip
        events += [
            (s.raw(JOB, "process_exited", f"node-{rank}"), died),
            (s.fault(JOB, "process"), _fault(bus, when + 0.1, rank, generation)),
            (
                s.action(JOB),
                RecoveryStarted(
                    source=src,
                    job=JOB,
                    fault_id="f",
                    level=RecoveryLevel.PROCESS,
                    reason="process_crash",
                    from_generation=generation,
                    to_generation=generation + 1,
                    time=_at(when + 0.2),
                ),
            ),
            (s.cmd(JOB, 0), _assign(bus, when + 0.3, generation + 1, 2)),
            (
                s.action(JOB),
                RecoveryFinished(
                    source=src,
                    job=JOB,
                    fault_id="f",
                    level=RecoveryLevel.PROCESS,
                    reason="process_crash",
                    duration_seconds=1.5,
                    time=_at(when + 1.6),
                ),
            ),
        ]
    grow = ScaleDecided(
        source=src, job=JOB, resize="grow", from_replicas=2, to_replicas=4,
        why="4 free GPUs", from_generation=2, to_generation=3, time=_at(40),
    )  # fmt: skip
    events += [
        (s.action(JOB), grow),
        (s.cmd(JOB, 0), _assign(bus, 40.5, 3, 4)),
        (s.action(JOB), PhaseChanged(source=src, job=JOB, phase=JobPhase.SUCCEEDED, time=_at(60))),
    ]
    for subject, event in events:
        await bus.publish(subject, event)


def _data(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', page)
    assert found, "the page carries its data"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


async def test_a_report_holds_the_faults_recoveries_and_resize(bus: Bus, tmp_path: Path) -> None:
    await _store(bus)
    args = argparse.Namespace(job=JOB, out=tmp_path / "out")

    assert await write_report(bus, args) == 0

    png = (tmp_path / "out" / f"{JOB}.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    page = (tmp_path / "out" / f"{JOB}.html").read_text()
    assert "<svg" in page
    loads = re.findall(
        r'(?:src|href)\s*=\s*["\'](?:https?:)?//|<link|@import|url\(\s*["\']?http', page
    )
    assert loads == [], "the page opens offline: it loads nothing from the network"
    data = _data(page)
    faults = data["faults"]
    assert isinstance(faults, list)
    assert [(f["reason"], f["rank"], f["time"]) for f in faults] == [
        ("process_crash", 1, 20.3),
        ("process_crash", 0, 30.2),
    ]
    recoveries = data["recoveries"]
    assert [(r["level"], r["seconds"]) for r in recoveries] == [("process", 1.5)] * 2
    assert [(z["resize"], z["from"], z["to"]) for z in data["resizes"]] == [("grow", 2, 4)]
    assert [w for _, w in data["world"]] == [2, 4]
    summary = data["summary"]
    assert isinstance(summary, dict)
    assert summary["phase"] == "Succeeded" and summary["final_step"] == 49
    lost = summary["lost_seconds"]
    assert abs(lost["detection"] - 0.2) < 1e-6  # 0.1 s per fault
    assert lost["restart"] >= 3.0  # two recoveries of 1.5 s, and the resize's pause
    assert lost["redone_steps"] == 6.0  # steps 19, 20 and 23..26 again, at 1 s a step
    assert 0 < summary["goodput"] < 1
    assert "goodput" in page and "lost steps trained again" in page


async def test_a_job_with_nothing_stored_is_named(bus: Bus, tmp_path: Path) -> None:
    args = argparse.Namespace(job="never", out=tmp_path)
    assert await write_report(bus, args) == 1
    assert not (tmp_path / "never.png").exists() and not (tmp_path / "never.html").exists()
