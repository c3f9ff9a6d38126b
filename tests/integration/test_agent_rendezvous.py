"""The launch agent hosts its generation's rendezvous store and says when every rank
joined it; it reports a worker's exit when the process exits, with its last lines.

Real agent processes (fork server with torch preloaded), real gloo, plain scripts that
never import resurge.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.events import (
    AgentState,
    AgentStateChanged,
    Assign,
    Event,
    LogLine,
    ProcessExited,
    RendezvousPassed,
    ReplicaSlot,
    Stop,
)
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.collect import Events
from tests.integration.agent_process import free_port, launch_agent

JOB = "rdzv"

# Rank 1 calls init_process_group only once the file named by argv[1] exists.
GATED_GLOO = """
import os, sys, time
from pathlib import Path
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
if rank == 1:
    print("rank 1 waits at the gate", flush=True)
    while not Path(sys.argv[1]).exists():
        time.sleep(0.01)
print(f"rank {rank} calls init_process_group", flush=True)
dist.init_process_group("gloo")
print(f"rank {rank} initialized", flush=True)
value = torch.ones(1)
dist.all_reduce(value)
print(f"rank {rank} sum {int(value.item())}", flush=True)
dist.destroy_process_group()
"""

# Prints 25 lines, forks a child that keeps stdout open and sleeps, prints its pid on
# stderr, then dies.
FORKS_AND_DIES = """
import os, sys, time
for i in range(25):
    print(f"line {i}", flush=True)
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
print(f"child {child}", file=sys.stderr, flush=True)
os._exit(3)
"""


def start_agent(
    settings: Settings, tmp_path: Path, argv: list[str], nproc: int, preload: list[str]
) -> subprocess.Popen[bytes]:
    spec = WorkerGroupSpec(
        job=JOB,
        replica=0,
        node="n1",
        nproc=nproc,
        command=argv,
        stop_grace_seconds=1.0,
        preload=preload,
    )
    return launch_agent(settings, spec, tmp_path / "agent.log", {"OMP_NUM_THREADS": "1"})


def assign(bus: Bus, nproc: int, port: int) -> Assign:
    return Assign(
        source=bus.source,
        job=JOB,
        replica=0,
        generation=0,
        world_size=nproc,
        rank_table=[ReplicaSlot(replica=0, node="n1", first_rank=0, nproc=nproc)],
        master_addr="127.0.0.1",
        master_port=port,
    )


async def stop_for_good(bus: Bus, agent: subprocess.Popen[bytes]) -> None:
    await bus.publish(
        bus.subjects.cmd(JOB, 0),
        Stop(source=bus.source, job=JOB, replica=0, generation=0, final=True),
    )
    assert await asyncio.to_thread(agent.wait, 60) == 0


def said(text: str) -> Callable[[list[Event]], bool]:
    return lambda items: any(isinstance(e, LogLine) and e.line == text for e in items)


async def test_rendezvous_passed_once_after_every_rank_joined_a_plain_gloo_job(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script = tmp_path / "gated.py"
    script.write_text(GATED_GLOO)
    argv = [sys.executable, str(script), str(gate)]
    agent = start_agent(settings, tmp_path, argv, nproc=2, preload=["torch"])
    try:
        await bus.publish(bus.subjects.cmd(JOB, 0), assign(bus, 2, free_port()))
        await raw_events.wait_for(said("rank 0 calls init_process_group"), seconds=120)
        await raw_events.wait_for(said("rank 1 waits at the gate"), seconds=60)
        # Rank 0 is in init_process_group, rank 1 not yet: the generation has not started.
        assert raw_events.of(RendezvousPassed) == []
        gate.touch()
        await raw_events.wait_for(lambda items: raw_events.of(RendezvousPassed), seconds=60)
        await raw_events.wait_for(said("rank 0 sum 2"), seconds=60)
        await raw_events.wait_for(said("rank 1 sum 2"), seconds=60)
        await raw_events.wait_for(
            lambda items: any(
                isinstance(e, AgentStateChanged) and e.state is AgentState.IDLE for e in items
            ),
            seconds=60,
        )
        await stop_for_good(bus, agent)
        await bus.nc.flush()
        passed = raw_events.of(RendezvousPassed)
        assert len(passed) == 1
        assert (passed[0].generation, passed[0].world_size, passed[0].replica) == (0, 2, 0)
        exits = raw_events.of(ProcessExited)
        assert [e.exit_code for e in exits] == [0, 0]  # both ranks used the agent's store
    finally:
        agent.kill()


async def test_exit_is_reported_while_a_forked_child_holds_stdout_with_its_last_lines(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    argv = [sys.executable, "-c", FORKS_AND_DIES]
    agent = start_agent(settings, tmp_path, argv, nproc=1, preload=["json"])
    child = None
    try:
        await bus.publish(bus.subjects.cmd(JOB, 0), assign(bus, 1, free_port()))
        exited = await raw_events.wait_for(lambda items: raw_events.of(ProcessExited), 60)
        lines = await raw_events.wait_for(
            lambda items: [e.line for e in raw_events.of(LogLine) if e.line.startswith("child ")]
        )
        child = int(lines[0].split()[1])
        os.kill(child, 0)  # the child still lives, and holds the worker's stdout
        assert exited[0].exit_code == 3
        last = exited[0].last_output
        assert len(last) == 20
        assert f"child {child}" in last
        assert [line for line in last if line.startswith("line ")] == [
            f"line {i}" for i in range(25) if f"line {i}" in last
        ]
        assert "line 24" in last and "line 0" not in last
        await stop_for_good(bus, agent)
        # The stop took what was left of the worker's process group with it.
        try:
            pidfd = os.pidfd_open(child)
        except ProcessLookupError:
            pass
        else:
            try:
                assert select.select([pidfd], [], [], 30)[0] == [pidfd]
            finally:
                os.close(pidfd)
    finally:
        agent.kill()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, 9)


PRINT_TITLE = (
    "import sys; print(open('/proc/self/cmdline').read().replace(chr(0), ' ').strip()); "
    "print(open('/proc/self/comm').read().strip()); print(repr(sys.argv)); "
    "print('environ', [v for v in open('/proc/self/environ', 'rb').read().split(bytes(1)) "
    "if v.startswith(b'PATH=')] != [])"
)


async def test_a_forked_worker_shows_its_rank_in_ps_and_keeps_its_argv(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    argv = [sys.executable, "-c", PRINT_TITLE, "--flag"]
    agent = start_agent(settings, tmp_path, argv, nproc=2, preload=["json"])
    try:
        await bus.publish(bus.subjects.cmd(JOB, 0), assign(bus, 2, free_port()))
        await raw_events.wait_for(lambda items: len(raw_events.of(ProcessExited)) == 2, 60)
        lines = {(e.rank, e.line) for e in raw_events.of(LogLine)}
        for rank in (0, 1):
            title = f"resurge worker job={JOB} rank={rank} local_rank={rank} gen=0: python -c "
            assert any(r == rank and line.startswith(title) for r, line in lines), lines
            assert (rank, "resurge worker") in lines  # comm, what `ps -e` shows
            assert (rank, repr(["-c", "--flag"])) in lines  # the script's own argv
            # The title did not overwrite the environment the process started with (the
            # fork server's, inherited): /proc/PID/environ still reads as one.
            assert (rank, "environ True") in lines, lines
        await stop_for_good(bus, agent)
    finally:
        agent.kill()
