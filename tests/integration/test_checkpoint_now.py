"""CheckpointNow end to end: a real node agent process passes it on to its workers that
use ``resurge.worker``; they save and report a checkpoint, seen as CheckpointSaved on the
raw subjects. Plain workers and requests for other generations are left alone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.control.effects.job_messages import send_checkpoint_requests
from resurge.control.state.records import JobRecord, Placement
from resurge.events import CheckpointNow, CheckpointSaved, Event, LogLine, Progress, Stop
from resurge.local import job_factory
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from resurge_node_agent.launch.group_spec import spec_environment
from tests.collect import Events
from tests.integration.test_node_agent import assign

JOB = "j.x"
WORKER = Path(__file__).resolve().parents[1] / "e2e" / "workers" / "checkpoint_worker.py"


def record(generation: int, replicas: int = 1) -> JobRecord:
    """The job's record (one record: every call has the same uid, so the same ids)."""
    placements = [Placement(replica=r, node=f"n{r + 1}") for r in range(replicas)]
    spec = job_factory.job("j")
    return JobRecord(name=JOB, uid="u1", spec=spec, generation=generation, placements=placements)


def read(path: Path) -> str:
    """A small local file's text (a sync helper: local, instant)."""
    return path.read_text()


def start_agent(settings: Settings, tmp_path: Path) -> subprocess.Popen[bytes]:
    """The launch agent of replica 0 on n1: local rank 0 uses resurge.worker, 1 does not."""
    spec = WorkerGroupSpec(
        job=JOB,
        replica=0,
        node="n1",
        nproc=2,
        command=[
            *(sys.executable, str(WORKER)),
            *("--checkpoint-dir", str(tmp_path / "ckpt"), "--plain-rank", "1"),
        ],
        env={"OMP_NUM_THREADS": "1"},
        stop_grace_seconds=2.0,
        preload=[],
    )
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_LOG_FORMAT": "text",
        **spec_environment(spec),
    }
    with (tmp_path / "agent.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "resurge_node_agent", "launch"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


async def test_checkpoint_requests_go_to_every_replica_with_repeatable_ids(bus: Bus) -> None:
    seen = Events()
    sub = await bus.subscribe(bus.subjects.cmd(JOB, None), seen.add)
    await bus.nc.flush()
    try:
        await send_checkpoint_requests(bus, record(4, replicas=2), "resize 2 -> 4")
        await send_checkpoint_requests(bus, record(4, replicas=2), "resize 2 -> 3")
        await seen.wait_for(lambda items: len(items) == 4)
    finally:
        await sub.unsubscribe()
    requests = seen.of(CheckpointNow)
    assert sorted((r.replica, r.generation, r.reason) for r in requests) == [
        (0, 4, "resize 2 -> 3"),
        (0, 4, "resize 2 -> 4"),
        (1, 4, "resize 2 -> 3"),
        (1, 4, "resize 2 -> 4"),
    ]
    assert len({r.id for r in requests}) == 4  # another replica or reason: another request
    again = Events()
    sub = await bus.subscribe(bus.subjects.cmd(JOB, 0), again.add)
    await bus.nc.flush()
    try:
        await send_checkpoint_requests(bus, record(4), "resize 2 -> 4")
        await again.wait_for(lambda items: len(items) == 1)
    finally:
        await sub.unsubscribe()
    [repeat] = again.of(CheckpointNow)
    assert repeat.id in {r.id for r in requests}  # the same request: JetStream drops it


async def test_a_checkpoint_request_makes_a_connected_worker_save_and_report(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    agent = start_agent(settings, tmp_path)
    subject = bus.subjects.cmd(JOB, 0)

    def progress_of_rank0(at_least: int) -> Callable[[list[Event]], bool]:
        return lambda items: any(
            isinstance(e, Progress) and e.local_rank == 0 and e.step >= at_least for e in items
        )

    try:
        await bus.publish(subject, assign(bus, 0))
        await raw_events.wait_for(progress_of_rank0(1))  # local rank 0 is connected
        await raw_events.wait_for(
            lambda items: any(isinstance(e, LogLine) and e.line == "plain ready" for e in items)
        )
        # For a generation the agent does not run: ignored.
        await bus.publish(
            subject,
            CheckpointNow(source=bus.source, job=JOB, replica=0, generation=3, reason="stale"),
        )
        await send_checkpoint_requests(bus, record(0), "resize 2 -> 4")
        [saved] = await raw_events.wait_for(lambda items: raw_events.of(CheckpointSaved))
        assert (saved.generation, saved.rank, saved.local_rank, saved.node) == (0, 0, 0, "n1")
        assert saved.world_size == 2  # its generation's, so it counts with no other's
        assert read(Path(saved.path, "rank-0")) == f"{saved.step}\n"
        lines = await raw_events.wait_for(
            lambda items: [
                e.line for e in items if isinstance(e, LogLine) and e.line.startswith("SIGUSR1")
            ]
        )
        assert len(lines) == 1  # the opt-in signal reached the script's handler, once
        # The script's own line comes by its stdout, apart from the event: awaited.
        await raw_events.wait_for(
            lambda items: any(
                isinstance(e, LogLine) and e.line == f"saved step {saved.step} (resize 2 -> 4)"
                for e in items
            )
        )
        # Several steps later still one checkpoint: the stale request saved nothing.
        await raw_events.wait_for(progress_of_rank0(saved.step + 5))
        assert len(raw_events.of(CheckpointSaved)) == 1
        await bus.publish(
            subject,
            Stop(source=bus.source, job=JOB, replica=0, generation=0, final=True),
        )
        assert await asyncio.to_thread(agent.wait, 20) == 0
    finally:
        agent.kill()
    log = read(tmp_path / "agent.log")
    assert "ignoring a checkpoint request for generation 3" in log
    assert "asked local ranks [0] of generation 0 for a checkpoint (resize 2 -> 4)" in log
    assert "left alone: [1]" in log
