"""In-process restarts through a real launch agent: real nats-server, real torch workers.

Each test runs a launch agent process (fork server with torch preloaded) whose two
workers train a tiny DDP model with gloo under ``resurge.worker.restartable``; the test
plays the restarter by publishing Assign and InjectFault commands and reads the raw
events the agent publishes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.events import (
    AgentState,
    AgentStateChanged,
    Assign,
    Event,
    InjectFault,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    Progress,
    RecoveryLevel,
    ReplicaSlot,
    Stop,
    WorkerFault,
)
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from resurge_node_agent.launch.group_spec import spec_environment
from tests.collect import Events

pytestmark = pytest.mark.slow

JOB = "j.inproc"
WAIT = 60.0

# Trains forever (the test stops it): DDP over gloo, one progress report per step,
# starting after the step the generation resumes from, with the restart count its
# process group met under (TORCHELASTIC_RESTART_COUNT). Once the file FREEZE exists
# (all ranks agree on it through a collective, at the same step), a generation-0 rank 1
# stops itself (SIGSTOP) and rank 0 waits in Python, where a restart reaches it.
TRAIN = """
import gc, os, signal, time
from datetime import timedelta
import torch, torch.distributed as dist
from resurge import worker

def frozen():
    if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
        return False
    flag = torch.tensor([float(os.path.exists(os.environ["FREEZE"]))])
    dist.all_reduce(flag)
    return flag.item() > 0

@worker.restartable
def train(run):
    if os.environ["RANK"] == "0" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "2":
        time.sleep(1)  # a rank 0 slow to start again: rank 1 reads the store first
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    step = run.resume_step or 0
    while step < 100_000:
        step += 1
        if frozen():
            if os.environ["RANK"] == "1":
                os.kill(os.getpid(), signal.SIGSTOP)
            while True:
                time.sleep(0.01)
        model(torch.ones(2, 4)).sum().backward()
        run.progress(step, attempt=float(os.environ["TORCHELASTIC_RESTART_COUNT"]))
        time.sleep(0.02)
    del model
    gc.collect()
    dist.destroy_process_group()

train()
"""


@pytest.fixture
def agent(
    settings: Settings, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_LOG_FORMAT": "text",
    }
    spec = WorkerGroupSpec(
        job=JOB,
        replica=0,
        node="n1",
        nproc=2,
        command=[sys.executable, "-c", TRAIN],
        env={"OMP_NUM_THREADS": "1", "FREEZE": str(tmp_path / "freeze")},
        stop_grace_seconds=1,
        preload=["torch"],
    )
    env |= spec_environment(spec)
    argv = [sys.executable, "-m", "resurge_node_agent", "launch"]
    failed_before = request.session.testsfailed
    path = tmp_path / "agent.log"
    with path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    yield proc
    if request.session.testsfailed > failed_before and proc.poll() is None:
        show_stacks(proc, path)
    proc.kill()
    proc.wait()


def show_stacks(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Print the end of a failed test's agent log, with every thread's stack (the
    services print them on SIGQUIT): where the agent was when the test gave up."""
    size = log.stat().st_size
    proc.send_signal(signal.SIGQUIT)
    deadline = time.monotonic() + 5
    while log.stat().st_size == size and time.monotonic() < deadline:
        time.sleep(0.1)  # the dump is written by the agent's signal handler
    time.sleep(0.5)
    print("\n".join(log.read_text(errors="replace").splitlines()[-150:]))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def assign(
    bus: Bus,
    generation: int,
    *,
    in_process: bool = False,
    resume_step: int | None = None,
    rejoin_timeout: float = 20.0,
) -> Assign:
    return Assign(
        source=bus.source,
        job=JOB,
        replica=0,
        generation=generation,
        world_size=2,
        rank_table=[ReplicaSlot(replica=0, node="n1", first_rank=0, nproc=2)],
        master_addr="127.0.0.1",
        master_port=free_port(),
        restart_count=generation,
        resume_step=resume_step,
        level=RecoveryLevel.IN_PROCESS if in_process else None,
        rejoin_timeout_seconds=rejoin_timeout,
    )


def progressed(generation: int, steps: int = 1) -> Callable[[list[Event]], bool]:
    """A test for Events.wait_for: both ranks reported ``steps`` steps of ``generation``."""

    def test(items: list[Event]) -> bool:
        counts = [0, 0]
        for e in items:
            if isinstance(e, Progress) and e.generation == generation:
                counts[e.local_rank] += 1
        return min(counts) >= steps

    return test


def first_steps(events: Events, generation: int) -> dict[int, int]:
    firsts: dict[int, int] = {}
    for e in events.of(Progress):
        if e.generation == generation:
            firsts.setdefault(e.local_rank, e.step)
    return firsts


async def stop_final(bus: Bus, agent: subprocess.Popen[bytes], generation: int) -> None:
    stop = Stop(source=bus.source, job=JOB, replica=0, generation=generation, final=True)
    await bus.publish(bus.subjects.cmd(JOB, 0), stop)
    assert await asyncio.to_thread(agent.wait, WAIT) == 0


def running_in_process(generation: int) -> Callable[[list[Event]], bool]:
    def test(items: list[Event]) -> bool:
        detail = f"generation {generation} running (in-process)"
        return any(isinstance(e, AgentStateChanged) and e.detail == detail for e in items)

    return test


async def test_in_process_restart_keeps_every_worker_process(
    bus: Bus, raw_events: Events, agent: subprocess.Popen[bytes]
) -> None:
    subject = bus.subjects.cmd(JOB, 0)
    await bus.publish(subject, assign(bus, 0))
    await raw_events.wait_for(progressed(0, steps=3), WAIT)
    pids = {e.local_rank: e.pid for e in raw_events.of(ProcessStarted)}
    assert all(e.in_process for e in raw_events.of(Progress))

    await bus.publish(subject, assign(bus, 1, in_process=True, resume_step=40))
    await raw_events.wait_for(progressed(1), WAIT)

    assert raw_events.of(ProcessExited) == []
    for pid in pids.values():
        os.kill(pid, 0)  # still alive: the same processes run generation 1
    assert first_steps(raw_events, 1) == {0: 41, 1: 41}  # resumed after step 40
    await raw_events.wait_for(running_in_process(1), WAIT)
    # each worker is reported started in generation 1, in the same process
    assert [
        (e.generation, e.local_rank, e.pid, e.in_process) for e in raw_events.of(ProcessStarted)
    ] == [
        (0, 0, pids[0], False),
        (0, 1, pids[1], False),
        (1, 0, pids[0], True),
        (1, 1, pids[1], True),
    ]
    # reports carry the generation their worker is in: never back to 0 once in 1
    for local_rank in (0, 1):
        reports = [e for e in raw_events.of(Progress) if e.local_rank == local_rank]
        seen = [e.generation for e in reports if e.generation is not None]
        assert len(seen) == len(reports) and seen == sorted(seen), seen
    await stop_final(bus, agent, 1)


async def test_a_worker_that_cannot_rejoin_makes_the_agent_restart_the_processes(
    bus: Bus, raw_events: Events, agent: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    subject = bus.subjects.cmd(JOB, 0)
    await bus.publish(subject, assign(bus, 0))
    await raw_events.wait_for(progressed(0, steps=3), WAIT)
    old = {e.local_rank: e.pid for e in raw_events.of(ProcessStarted)}
    (tmp_path / "freeze").touch()  # rank 1 stops itself: it cannot answer the restart
    await raw_events.wait_for(
        lambda items: any(isinstance(e, ProcessStateChanged) and e.stopped for e in items), WAIT
    )

    await bus.publish(subject, assign(bus, 1, in_process=True, rejoin_timeout=2.0))
    await raw_events.wait_for(progressed(1), WAIT)

    escalated = [
        e
        for e in raw_events.of(AgentStateChanged)
        if e.state is AgentState.STOPPING and "escalated to a process restart" in e.detail
    ]
    # rank 0 rejoined, rank 1 could not
    assert (
        len(escalated) == 1 and "(local ranks 1 did not rejoin within 2 s)" in escalated[0].detail
    )
    new = {e.local_rank: e.pid for e in raw_events.of(ProcessStarted) if e.generation == 1}
    assert sorted(new) == [0, 1] and not set(new.values()) & set(old.values())
    assert {e.pid for e in raw_events.of(ProcessExited) if e.expected} == set(old.values())
    # Rank 0 had rejoined generation 1's rendezvous in-process, leaving its address in
    # the store; the new processes meet in a new store, or rank 1, first there (the new
    # rank 0 starts late, see TRAIN), reads the address of the killed rank 0 and fails
    # to connect. They are one restart further on (TORCHELASTIC_RESTART_COUNT).
    attempts = {e.metrics.get("attempt") for e in raw_events.of(Progress) if e.generation == 1}
    assert attempts == {2.0}, attempts
    await stop_final(bus, agent, 1)


async def test_an_exception_in_a_worker_is_published_and_recovered_in_process(
    bus: Bus, raw_events: Events, agent: subprocess.Popen[bytes]
) -> None:
    subject = bus.subjects.cmd(JOB, 0)
    await bus.publish(subject, assign(bus, 0))
    await raw_events.wait_for(progressed(0, steps=3), WAIT)
    inject = InjectFault(
        source=bus.source, job=JOB, replica=0, generation=0, fault="exception", local_rank=1
    )
    await bus.publish(subject, inject)
    [fault] = await raw_events.wait_for(
        lambda items: [e for e in items if isinstance(e, WorkerFault)], WAIT
    )
    assert (fault.job, fault.generation, fault.rank, fault.local_rank) == (JOB, 0, 1, 1)
    assert fault.exception == "resurge.worker.restart.InjectedFault"
    assert "in train" in fault.traceback

    await bus.publish(subject, assign(bus, 1, in_process=True, resume_step=0))
    await raw_events.wait_for(progressed(1), WAIT)
    assert raw_events.of(ProcessExited) == []
    await raw_events.wait_for(running_in_process(1), WAIT)
    starts = raw_events.of(ProcessStarted)
    assert [(e.generation, e.in_process) for e in starts] == [(0, False)] * 2 + [(1, True)] * 2
    # rank 0 failed only because rank 1 left: the restart came within its grace, so
    # the one fault published is rank 1's
    assert [e.rank for e in raw_events.of(WorkerFault)] == [1]
    await stop_final(bus, agent, 1)
