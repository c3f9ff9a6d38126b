"""A replica's agent SIGKILLed mid-training: its workers die with it, its node's monitor
says the agent was lost, and the job gets a new generation at once (a `pod` restart:
a new agent) instead of waiting for its peers' collectives to time out.

Real processes throughout: the DDP example's gloo workers, agents, monitors, services.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from resurge.events import (
    AgentState,
    AgentStateChanged,
    FaultDetected,
    JobPhase,
    ProcessStarted,
    Progress,
    RecoveryFinished,
    RecoveryLevel,
)
from resurge.local.demo import demo_job, final_step, total_steps
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus

pytestmark = pytest.mark.e2e


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def trained(steps: int) -> Callable[[list[Observed]], bool]:
    def test(seen: list[Observed]) -> bool:
        return any(isinstance(o.event, Progress) and o.event.step >= steps for o in seen)

    return test


async def test_a_sigkilled_agent_takes_its_workers_and_its_replica_is_recreated(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = demo_job(tmp_path)
    killed: dict[str, int] = {}

    async def kill_agent_of_replica_1(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(trained(15), wait_seconds=90)
        [agent] = {o.event.source.instance for o in watch.observed
                   if isinstance(o.event, AgentStateChanged) and o.event.replica == 1}  # fmt: skip
        killed["agent"] = int(agent.rsplit(":", 1)[1])
        workers = [o.event for o in watch.observed if isinstance(o.event, ProcessStarted)]
        killed.update({f"worker-{e.local_rank}": e.pid for e in workers if e.replica == 1})
        os.kill(killed["agent"], signal.SIGKILL)

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=2, wait_seconds=150, during=kill_agent_of_replica_1,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == total_steps(job)
    lost = [e for e in result.events(AgentStateChanged)
            if isinstance(e, AgentStateChanged) and e.state is AgentState.LOST]  # fmt: skip
    assert [e.replica for e in lost] == [1] and "-9" in lost[0].detail
    faults = [f for f in result.faults if isinstance(f, FaultDetected)]
    print("faults:", [(f.reason, f.replica, f.rank, f.generation) for f in faults])
    assert [(f.replica, f.generation) for f in faults if f.reason == "agent_lost"] == [(1, 0)]
    assert {f.generation for f in faults} == {0}  # one incident: nothing broke generation 1
    [recovery] = [e for e in result.events(RecoveryFinished) if isinstance(e, RecoveryFinished)]
    assert recovery.generation == 1
    # Which fault the restarter judges first is a race: the lost agent (its replica is
    # recreated, at pod level) or, on a loaded machine, replica 0's workers failing their
    # collective with the killed ones (a process restart; the monitor starts the lost
    # agent again and it takes the new generation's Assign).
    expected = RecoveryLevel.POD if recovery.reason == "agent_lost" else RecoveryLevel.PROCESS
    assert recovery.level is expected, recovery
    still_running = [name for name, pid in killed.items() if not gone(pid)]
    assert still_running == []  # the agent and the workers it started
