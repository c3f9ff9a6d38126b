"""How a real agent stops real workers: hung ones at once, the rest with their grace;
stopped workers are reported; workers die with their agent.

Every worker here is a real process started by a real `resurge-node-agent launch`
against a real nats-server; SIGSTOP, SIGCONT and SIGKILL are real signals.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.events import (
    AgentState,
    AgentStateChanged,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    Stop,
    StopFirst,
)
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from resurge_node_agent.launch.group_spec import spec_environment
from tests.collect import Events
from tests.integration.test_node_agent import assign

# Says it is ready, then, on SIGTERM, takes half a second to "save" and exits 3.
SAVES_ON_TERM = (
    "import signal, sys, time\n"
    "def term(*_):\n"
    "    time.sleep(0.5); print('saved', flush=True); sys.exit(3)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)
# Local rank 0 exits on SIGTERM; local rank 1 starts a "save" that never ends.
RANK_1_SAVES_FOREVER = (
    "import os, signal, sys, time\n"
    "if os.environ['LOCAL_RANK'] == '0':\n"
    "    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
    "else:\n"
    "    signal.signal(signal.SIGTERM, lambda *_: print('saving', flush=True))\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)
IGNORES_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(120)"
)
LONG_GRACE = 30.0  # every stop below must end far sooner: nothing waits for it
# The agent as pid 1 of its own PID namespace, as a container's entrypoint is.
AS_PID_1 = (
    "unshare",
    "--user",
    "--map-root-user",
    "--pid",
    "--fork",
    "--mount-proc",
    "--kill-child",
)


def start_agent(
    settings: Settings,
    code: str,
    tmp_path: Path,
    *,
    fork_server: bool = True,
    wrapper: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    spec = WorkerGroupSpec(
        job="j.x",
        replica=0,
        node="n1",
        nproc=2,
        command=[sys.executable, "-c", code],
        stop_grace_seconds=LONG_GRACE,
        fork_server=fork_server,
        preload=["json"],
    )
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_LOG_FORMAT": "text",
        **spec_environment(spec),
    }
    argv = [sys.executable, "-m", "resurge_node_agent", "launch"]
    log = (tmp_path / "agent.log").open("wb")
    return subprocess.Popen([*wrapper, *argv], env=env, stdout=log, stderr=subprocess.STDOUT)


async def running_workers(bus: Bus, raw: Events) -> dict[int, int]:
    """Assign generation 0 and wait for both workers to say they are ready."""
    await bus.publish(bus.subjects.cmd("j.x", 0), assign(bus, 0))
    await raw.wait_for(lambda items: sum(getattr(e, "line", "") == "ready" for e in items) == 2)
    return {e.local_rank: e.pid for e in raw.of(ProcessStarted)}


async def exits(raw: Events, seconds: float = 10) -> dict[int, ProcessExited]:
    """Both workers' exits; ``seconds`` stays far below LONG_GRACE."""
    await raw.wait_for(
        lambda items: len([e for e in items if isinstance(e, ProcessExited)]) == 2, seconds
    )
    return {e.local_rank: e for e in raw.of(ProcessExited)}


def stop(bus: Bus, **fields: object) -> Stop:
    return Stop(
        source=bus.source, job="j.x", replica=0, generation=0, timeout_seconds=LONG_GRACE, **fields
    )


async def test_a_stopped_worker_is_reported_and_killed_at_once_the_other_keeps_its_grace(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    agent = start_agent(settings, SAVES_ON_TERM, tmp_path)
    try:
        pids = await running_workers(bus, raw_events)
        os.kill(pids[1], signal.SIGSTOP)
        [state] = await raw_events.wait_for(
            lambda items: [e for e in items if isinstance(e, ProcessStateChanged) and e.stopped]
        )
        assert (state.local_rank, state.pid, state.rank, state.generation) == (1, pids[1], 1, 0)
        await bus.publish(bus.subjects.cmd("j.x", 0), stop(bus, final=True))
        done = await exits(raw_events)
        assert done[1].signal == "SIGKILL" and done[1].expected
        assert done[0].exit_code == 3 and done[0].expected  # it saved and exited by itself
        lines = [getattr(e, "line", "") for e in raw_events.items]
        assert "saved" in lines
        # The stop returned (a final stop's agent says it exits once its workers are
        # down) long before the grace would have ended.
        await raw_events.wait_for(
            lambda items: any(
                isinstance(e, AgentStateChanged) and e.state is AgentState.EXITING for e in items
            ),
            10,
        )
        assert await asyncio.to_thread(agent.wait, 10) == 0
    finally:
        agent.kill()
        agent.wait()


async def test_a_worker_stopped_during_the_grace_is_killed_then(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    agent = start_agent(settings, RANK_1_SAVES_FOREVER, tmp_path)
    try:
        pids = await running_workers(bus, raw_events)
        await bus.publish(bus.subjects.cmd("j.x", 0), stop(bus))
        # The grace has begun: rank 0 is gone, rank 1 took its SIGTERM and is saving.
        await raw_events.wait_for(
            lambda items: (
                any(isinstance(e, ProcessExited) for e in items)
                and any(getattr(e, "line", "") == "saving" for e in items)
            )
        )
        os.kill(pids[1], signal.SIGSTOP)
        done = await exits(raw_events)
        assert done[0].exit_code == 3 and done[0].expected
        assert done[1].signal == "SIGKILL" and done[1].expected
    finally:
        agent.kill()
        agent.wait()


async def test_an_assign_that_replaces_a_stopped_worker_kills_it_at_once(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    agent = start_agent(settings, SAVES_ON_TERM, tmp_path)
    try:
        pids = await running_workers(bus, raw_events)
        os.kill(pids[1], signal.SIGSTOP)
        await raw_events.wait_for(
            lambda items: any(isinstance(e, ProcessStateChanged) and e.stopped for e in items)
        )
        await bus.publish(bus.subjects.cmd("j.x", 0), assign(bus, 1))
        done = await exits(raw_events)
        assert done[1].signal == "SIGKILL" and done[1].expected
        assert done[0].exit_code == 3 and done[0].expected  # the configured grace, used
        await raw_events.wait_for(
            lambda items: (
                len([e for e in items if isinstance(e, ProcessStarted) and e.generation == 1]) == 2
            ),
            10,
        )
    finally:
        agent.kill()
        agent.wait()


async def test_a_worker_that_runs_again_is_reported_running(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    agent = start_agent(settings, SAVES_ON_TERM, tmp_path)
    try:
        pids = await running_workers(bus, raw_events)
        os.kill(pids[0], signal.SIGSTOP)
        await raw_events.wait_for(
            lambda items: any(isinstance(e, ProcessStateChanged) and e.stopped for e in items)
        )
        os.kill(pids[0], signal.SIGCONT)
        changes = await raw_events.wait_for(
            lambda items: (
                [(e.local_rank, e.stopped) for e in items if isinstance(e, ProcessStateChanged)]
                if any(isinstance(e, ProcessStateChanged) and not e.stopped for e in items)
                else None
            )
        )
        assert changes == [(0, True), (0, False)]
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.parametrize("how", ["not_graceful", "hung_ranks"])
async def test_hung_ranks_and_non_graceful_stops_kill_without_the_grace(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path, how: str
) -> None:
    code = IGNORES_TERM if how == "not_graceful" else SAVES_ON_TERM
    agent = start_agent(settings, code, tmp_path)
    try:
        await running_workers(bus, raw_events)
        fields = {"graceful": False} if how == "not_graceful" else {"hung_ranks": [1]}
        await bus.publish(bus.subjects.cmd("j.x", 0), stop(bus, **fields))
        done = await exits(raw_events)
        assert done[1].signal == "SIGKILL" and done[1].expected
        if how == "not_graceful":
            assert done[0].signal == "SIGKILL"
        else:
            assert done[0].exit_code == 3  # not hung: SIGTERM and its grace
    finally:
        agent.kill()
        agent.wait()


async def test_an_assign_that_folds_in_a_stop_stops_as_that_stop_says_then_starts(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    """One command for a restart: the Assign of generation 1 carries the Stop of
    generation 0 (its hung rank 1 killed at once, rank 0 given SIGTERM and its grace),
    and the new generation starts once they are gone, with no Stop sent."""
    agent = start_agent(settings, SAVES_ON_TERM, tmp_path)
    try:
        await running_workers(bus, raw_events)
        folded = StopFirst(generation=0, timeout_seconds=LONG_GRACE, hung_ranks=[1])
        restart = assign(bus, 1).model_copy(update={"stop": folded})
        await bus.publish(bus.subjects.cmd("j.x", 0), restart)
        done = await exits(raw_events)
        assert done[1].signal == "SIGKILL" and done[1].expected
        assert done[0].exit_code == 3  # not hung: SIGTERM and its grace
        await raw_events.wait_for(
            lambda items: any(isinstance(e, ProcessStarted) and e.generation == 1 for e in items),
        )
    finally:
        agent.kill()
        agent.wait()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


async def test_a_sigtermed_agent_stops_its_workers_and_reports_their_exits(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    """SIGTERM (its pod deleted, its worker group recreated) ends the agent as a Stop
    would: every worker gets SIGTERM and its grace, and every exit is reported."""
    agent = start_agent(settings, SAVES_ON_TERM, tmp_path)
    try:
        await running_workers(bus, raw_events)
        agent.send_signal(signal.SIGTERM)
        done = await exits(raw_events)
        assert all(e.exit_code == 3 and e.expected for e in done.values())
        assert await asyncio.to_thread(agent.wait, 10) == 0
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.parametrize("fork_server", [True, False])
async def test_workers_die_with_a_sigkilled_agent(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path, fork_server: bool
) -> None:
    agent = start_agent(settings, IGNORES_TERM, tmp_path, fork_server=fork_server)
    try:
        pids = await running_workers(bus, raw_events)
    finally:
        agent.kill()
        agent.wait()
    for _ in range(100):  # the kernel's signals to other processes: polled, bounded (10 s)
        if all(_gone(pid) for pid in pids.values()):
            break
        await asyncio.sleep(0.1)
    assert all(_gone(pid) for pid in pids.values()), f"workers outlived their agent: {pids}"


@pytest.fixture
def pid_namespaces() -> None:
    """Skipped, and said why, where this machine cannot make user and PID namespaces."""
    probe = subprocess.run([*AS_PID_1, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no user and PID namespaces here: {probe.stderr.strip()}")


@pytest.mark.parametrize("fork_server", [True, False])
async def test_an_agent_that_is_pid_1_keeps_its_workers(
    bus: Bus,
    settings: Settings,
    raw_events: Events,
    tmp_path: Path,
    fork_server: bool,
    pid_namespaces: None,
) -> None:
    """Its workers' parent is pid 1 (the agent, or the fork server's parent): that is not
    the mark of an orphan here."""
    agent = start_agent(
        settings, SAVES_ON_TERM, tmp_path, fork_server=fork_server, wrapper=AS_PID_1
    )
    try:
        await running_workers(bus, raw_events)
        await bus.publish(bus.subjects.cmd("j.x", 0), stop(bus))
        done = await exits(raw_events)
        assert (done[0].exit_code, done[1].exit_code) == (3, 3)
        log = (tmp_path / "agent.log").read_text()
        assert ("fork server ready" in log) is fork_server, log
    finally:
        agent.kill()
        agent.wait()
