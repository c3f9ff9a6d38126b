"""The node agent as a real process: Assign starts workers, Stop stops them, events flow."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.events import (
    AgentState,
    AgentStateChanged,
    Assign,
    Event,
    InjectFault,
    LogLine,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    ReplicaSlot,
    Stop,
)
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from resurge_node_agent.launch.group_spec import WORKER_GROUP_ENV
from tests.collect import E, Events
from tests.integration.agent_process import launch_agent

PRINT_ENV = (
    "import json, os; print(json.dumps({k: os.environ[k] for k in "
    "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'GROUP_WORLD_SIZE', 'MASTER_PORT', "
    "'RESURGE_GENERATION', 'EXTRA')} "
    "| {'GROUP_DOC': 'RESURGE_WORKER_GROUP' in os.environ}))"
)
IGNORE_TERM_AND_WAIT = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"
)


def start_agent(
    settings: Settings,
    code: str,
    tmp_path: Path,
    nproc: int = 2,
    grace: float = 1.0,
    uid: str = "",
    **group: Any,
) -> subprocess.Popen[bytes]:
    spec = WorkerGroupSpec(
        uid=uid,
        **group,
        job="j.x",
        replica=0,
        node="n1",
        nproc=nproc,
        command=[sys.executable, "-c", code],
        env={"EXTRA": "yes"},
        stop_grace_seconds=grace,
        preload=["json"],
    )
    return launch_agent(settings, spec, tmp_path / "agent.log")


def assign(bus: Bus, generation: int, nproc: int = 2, uid: str | None = None) -> Assign:
    return Assign(
        source=bus.source,
        uid=uid,
        job="j.x",
        replica=0,
        generation=generation,
        world_size=nproc,
        rank_table=[ReplicaSlot(replica=0, node="n1", first_rank=0, nproc=nproc)],
        master_addr="127.0.0.1",
        master_port=23456 + generation,
    )


async def stop_for_good(bus: Bus, agent: subprocess.Popen[bytes]) -> None:
    """A final Stop of generation 0 to replica 0; the agent then exits with 0."""
    await bus.publish(
        bus.subjects.cmd("j.x", 0),
        Stop(source=bus.source, job="j.x", replica=0, generation=0, final=True),
    )
    assert await asyncio.to_thread(agent.wait, 20) == 0


async def test_assign_runs_workers_with_torchrun_env_and_reports(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    agent = start_agent(settings, PRINT_ENV, tmp_path)
    try:
        await bus.publish(bus.subjects.cmd("j.x", 0), assign(bus, 0))
        await raw_events.wait_for(
            lambda items: any(
                isinstance(e, AgentStateChanged) and e.state is AgentState.IDLE for e in items
            )
        )
        started = raw_events.of(ProcessStarted)
        exited = raw_events.of(ProcessExited)
        assert sorted(e.local_rank for e in started) == [0, 1]
        assert all(e.exit_code == 0 and not e.expected for e in exited) and len(exited) == 2
        envs = [json.loads(e.line) for e in raw_events.of(LogLine)]
        assert sorted(env["RANK"] for env in envs) == ["0", "1"]
        assert {env["WORLD_SIZE"] for env in envs} == {"2"}
        assert {env["MASTER_PORT"] for env in envs} == {"23456"}
        assert {env["RESURGE_GENERATION"] for env in envs} == {"0"}
        assert {env["EXTRA"] for env in envs} == {"yes"}
        assert {env["GROUP_DOC"] for env in envs} == {False}  # the agent's, not theirs
        await stop_for_good(bus, agent)
    finally:
        agent.kill()


async def test_an_agent_ended_by_sigterm_says_it_exits_and_only_once(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    # A finished job's worker group is deleted (SIGTERM from its node) as its final Stop
    # goes out: the agent's last word must be `exiting` whichever comes first.
    agent = start_agent(settings, "pass", tmp_path, nproc=1)
    try:
        await bus.publish(bus.subjects.cmd("j.x", 0), assign(bus, 0, nproc=1))
        await raw_events.wait_for(
            lambda items: any(
                isinstance(e, AgentStateChanged) and e.state is AgentState.IDLE for e in items
            )
        )
        agent.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(agent.wait, 20) == 0
        await bus.publish(
            bus.subjects.cmd("j.x", 0),
            Stop(source=bus.source, job="j.x", replica=0, generation=0, final=True),
        )
        await raw_events.wait_for(
            lambda items: any(
                isinstance(e, AgentStateChanged) and e.state is AgentState.EXITING for e in items
            )
        )
        await bus.nc.flush()
        states = [e.state for e in raw_events.of(AgentStateChanged)]
        assert states[-1] is AgentState.EXITING and states.count(AgentState.EXITING) == 1
    finally:
        agent.kill()


async def test_an_assign_with_only_its_own_slot_runs_a_large_job_s_replica(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    # Above 64 replicas the restarter sends each replica its own slot and the count.
    agent = start_agent(settings, PRINT_ENV, tmp_path)
    try:
        own = assign(bus, 0).model_copy(update={"replicas": 100, "world_size": 200})
        await bus.publish(bus.subjects.cmd("j.x", 0), own)
        await raw_events.wait_for(lambda items: len(raw_events.of(LogLine)) == 2)
        envs = [json.loads(e.line) for e in raw_events.of(LogLine)]
        assert sorted(env["RANK"] for env in envs) == ["0", "1"]
        assert {(env["WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) for env in envs} == {("200", "100")}
        await stop_for_good(bus, agent)
    finally:
        agent.kill()


async def test_stop_escalates_to_sigkill_and_new_assign_replaces_generation(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    agent = start_agent(settings, IGNORE_TERM_AND_WAIT, tmp_path, nproc=1, grace=0.5)
    try:
        await bus.publish(bus.subjects.cmd("j.x", 0), assign(bus, 0, nproc=1))
        await raw_events.wait_for(
            lambda items: any(isinstance(e, LogLine) and e.line == "ready" for e in items)
        )
        await bus.publish(bus.subjects.cmd("j.x", 0), assign(bus, 1, nproc=1))
        await raw_events.wait_for(
            lambda items: any(isinstance(e, ProcessStarted) and e.generation == 1 for e in items)
        )
        [old_exit] = [e for e in raw_events.of(ProcessExited) if e.generation == 0]
        assert old_exit.expected and old_exit.signal == "SIGKILL"
        # an older or repeated assignment changes nothing
        await bus.publish(bus.subjects.cmd("j.x", 0), assign(bus, 0, nproc=1))
        await bus.publish(
            bus.subjects.cmd("j.x", 0),
            Stop(
                source=bus.source,
                job="j.x",
                replica=0,
                generation=1,
                final=True,
                timeout_seconds=0.5,
            ),
        )
        assert await asyncio.to_thread(agent.wait, 20) == 0
        assert [e.generation for e in raw_events.of(ProcessStarted)] == [0, 1]
    finally:
        agent.kill()


def launch(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``resurge-node-agent launch`` that ends before it connects (a bad worker group)."""
    return subprocess.run(
        [sys.executable, "-m", "resurge_node_agent", "launch", *args],
        env={key: value for key, value in os.environ.items() if key != WORKER_GROUP_ENV} | env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_launch_without_command_is_an_error() -> None:
    result = launch({WORKER_GROUP_ENV: '{"job": "j", "replica": 0, "node": "n1", "nproc": 1}'})
    assert result.returncode == 2
    assert "needs the worker command" in result.stderr
    assert "field 'command'" in result.stderr


def test_launch_names_the_bad_field_wherever_the_document_comes_from(tmp_path: Path) -> None:
    bad = '{"job": "j", "replica": -1, "node": "n1", "nproc": 1, "command": ["true"]}'
    (tmp_path / "group.json").write_text(bad)
    for result in (
        launch({WORKER_GROUP_ENV: bad}),
        launch({}, "--spec", str(tmp_path / "group.json")),
        launch({}, "--spec", "-", stdin=bad),
    ):
        assert result.returncode == 2
        assert "field 'replica'" in result.stderr
    unknown = launch({WORKER_GROUP_ENV: bad.replace('"replica": -1', '"replica": 0, "gpus": 2')})
    assert unknown.returncode == 2 and "field 'gpus'" in unknown.stderr
    missing = launch({})
    assert missing.returncode == 2 and WORKER_GROUP_ENV in missing.stderr


def test_launch_help_describes_the_worker_group_document() -> None:
    result = launch({}, "--help")
    assert result.returncode == 0
    assert WORKER_GROUP_ENV in result.stdout and "--spec" in result.stdout


async def test_new_agent_skips_an_earlier_runs_commands(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    subject = bus.subjects.cmd("j.x", 0)
    await bus.publish(subject, assign(bus, 0, nproc=1))
    await bus.publish(
        subject,
        Stop(
            source=bus.source,
            job="j.x",
            replica=0,
            generation=0,
            final=True,
            reason="earlier run over",
        ),
    )
    agent = start_agent(settings, PRINT_ENV, tmp_path, nproc=1)
    try:
        await raw_events.wait_for(
            lambda items: any(
                isinstance(e, AgentStateChanged) and e.state is AgentState.WAITING for e in items
            )
        )
        await bus.publish(subject, assign(bus, 1, nproc=1))
        await raw_events.wait_for(lambda items: any(isinstance(e, ProcessExited) for e in items))
        assert [e.generation for e in raw_events.of(ProcessStarted)] == [1]
        assert agent.poll() is None
        await bus.publish(
            subject, Stop(source=bus.source, job="j.x", replica=0, generation=1, final=True)
        )
        assert await asyncio.to_thread(agent.wait, 20) == 0
    finally:
        agent.kill()


async def test_workers_get_the_job_s_checkpoint_folder_and_intervals(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    code = (
        "import json, os; print(json.dumps({k: os.environ.get(k) for k in ("
        "'RESURGE_CHECKPOINT_DIR', 'RESURGE_CHECKPOINT_INTERVAL_STEPS', "
        "'RESURGE_CHECKPOINT_INTERVAL_SECONDS')}))"
    )
    folder = str(tmp_path / "ckpt")
    agent = start_agent(
        settings,
        code,
        tmp_path,
        nproc=1,
        checkpoint_dir=folder,
        checkpoint_interval_steps=25,
        checkpoint_interval_seconds=90.0,
    )
    try:
        await bus.publish(bus.subjects.cmd("j.x", 0), assign(bus, 0, nproc=1))
        await raw_events.wait_for(lambda items: bool(raw_events.of(LogLine)))
        [line] = raw_events.of(LogLine)
        assert json.loads(line.line) == {
            "RESURGE_CHECKPOINT_DIR": folder,
            "RESURGE_CHECKPOINT_INTERVAL_STEPS": "25",
            "RESURGE_CHECKPOINT_INTERVAL_SECONDS": "90.0",
        }
        await stop_for_good(bus, agent)
    finally:
        agent.kill()


async def test_a_new_run_s_agent_takes_none_of_the_deleted_run_s_commands(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    # Run "old" of j.x: its first agent (node n1, incarnation 0) handled generation 0 and
    # was then replaced; its run went on to generation 3 and failed for good.
    subject = bus.subjects.cmd("j.x", 0)
    first = start_agent(settings, "pass", tmp_path, nproc=1, uid="old")
    try:
        await bus.publish(subject, assign(bus, 0, nproc=1, uid="old"))
        await raw_events.wait_for(lambda items: len(raw_events.of(ProcessExited)) == 1)
        first.send_signal(signal.SIGTERM)  # it records where it is as it stops
        assert await asyncio.to_thread(first.wait, 20) == 0
    finally:
        first.kill()
    for generation in (1, 2, 3):
        await bus.publish(subject, assign(bus, generation, nproc=1, uid="old"))
    failed = Stop(
        source=bus.source,
        uid="old",
        job="j.x",
        replica=0,
        generation=3,
        final=True,
        reason="failed",
    )
    await bus.publish(subject, failed)
    seen = len(raw_events.items)

    def since(kind: type[E]) -> list[E]:
        return [e for e in raw_events.items[seen:] if isinstance(e, kind)]

    # Deleted and submitted again: run "new", whose agent is again node n1, incarnation 0.
    agent = start_agent(settings, "pass", tmp_path, nproc=1, uid="new")
    try:
        await raw_events.wait_for(
            lambda _: any(e.state is AgentState.WAITING for e in since(AgentStateChanged))
        )
        await bus.publish(subject, assign(bus, 0, nproc=1, uid="new"))
        await raw_events.wait_for(lambda _: bool(since(ProcessExited)))
        assert [e.generation for e in since(ProcessStarted)] == [0]
        assert agent.poll() is None
        await bus.publish(
            subject,
            Stop(source=bus.source, uid="new", job="j.x", replica=0, generation=0, final=True),
        )
        assert await asyncio.to_thread(agent.wait, 20) == 0
    finally:
        agent.kill()


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def test_injected_faults_hang_log_and_crash_a_worker(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    agent = start_agent(settings, IGNORE_TERM_AND_WAIT, tmp_path, nproc=2, grace=0.5)
    subject = bus.subjects.cmd("j.x", 0)

    def inject(fault: str, local_rank: int, line: str = "") -> InjectFault:
        return InjectFault(
            source=bus.source,
            job="j.x",
            replica=0,
            generation=0,
            fault=fault,
            local_rank=local_rank,
            line=line,
        )

    try:
        await bus.publish(subject, assign(bus, 0, nproc=2))
        await raw_events.wait_for(
            lambda items: sum(isinstance(e, LogLine) and e.line == "ready" for e in items) == 2
        )
        pids = {e.local_rank: e.pid for e in raw_events.of(ProcessStarted)}
        await bus.publish(subject, inject("log", 0, "CUDA error: an illegal memory access"))
        await raw_events.wait_for(
            lambda items: any(
                isinstance(e, LogLine) and e.line.startswith("CUDA error") for e in items
            )
        )
        [fake] = [e for e in raw_events.of(LogLine) if e.line.startswith("CUDA error")]
        assert (fake.local_rank, fake.stream) == (0, "stderr")
        logged = (tmp_path / "agent.log").read_text()  # the worker's output, as the agent echoes it
        assert "CUDA error: an illegal memory access" in logged
        await bus.publish(subject, inject("hang", 1))
        await bus.publish(subject, inject("crash", 0))
        await raw_events.wait_for(lambda items: any(isinstance(e, ProcessExited) for e in items))
        [crashed] = raw_events.of(ProcessExited)
        assert crashed.local_rank == 0 and crashed.signal == "SIGKILL" and not crashed.expected
        # SIGSTOP takes effect when the worker next runs, which on a busy machine can be
        # after rank 0's exit is reported: the agent says when it sees it stopped.
        await raw_events.wait_for(
            lambda items: any(
                isinstance(e, ProcessStateChanged) and e.local_rank == 1 and e.stopped
                for e in items
            )
        )
        assert process_state(pids[1]) == "T"  # stopped, as a hung worker would be silent
        await bus.publish(
            subject,
            Stop(
                source=bus.source,
                job="j.x",
                replica=0,
                generation=0,
                final=True,
                timeout_seconds=0.5,
            ),
        )
        assert await asyncio.to_thread(agent.wait, 20) == 0
    finally:
        agent.kill()


async def test_an_assign_that_moved_the_replica_elsewhere_starts_nothing_here(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    """A `node` recovery moves the replica; until the old agent is removed it still reads
    the replica's commands and must not start workers that would join the new generation."""
    agent = start_agent(settings, PRINT_ENV, tmp_path)
    try:
        moved = assign(bus, 1)
        moved = moved.model_copy(
            update={"rank_table": [ReplicaSlot(replica=0, node="n2", first_rank=0, nproc=2)]}
        )
        await bus.publish(bus.subjects.cmd("j.x", 0), moved)
        await bus.publish(bus.subjects.cmd("j.x", 0), assign(bus, 2))  # placed here again

        def two_started(items: list[Event]) -> list[ProcessStarted] | None:
            started = [e for e in items if isinstance(e, ProcessStarted)]
            return started if len(started) >= 2 else None

        started = await raw_events.wait_for(two_started)
        assert {e.generation for e in started} == {2}
    finally:
        agent.kill()
        agent.wait()
