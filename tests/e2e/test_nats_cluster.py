"""A local cluster on three NATS servers (``resurge up --nats-cluster 3``): one server
dies mid-job, and nothing is lost.

The DDP example trains; the test publishes probe events (each acknowledged by the
stream), SIGKILLs the server that leads the streams they went to, reads every probe
back through the servers left, and kills a torch worker. The crash is still detected
and recovered once, and the job ends Succeeded at its final step. Real processes
throughout: three nats-servers routed to each other, the services, node monitors,
agents, gloo workers.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from resurge.control.views.history import read_history
from resurge.events import (
    FaultDetected,
    JobPhase,
    PhaseChanged,
    ProcessStarted,
    RecoveryStarted,
)
from resurge.local.demo import demo_job, final_step, total_steps
from resurge.local.story import Watch, run_job
from resurge.runtime.bus import Bus
from tests.e2e.test_agent_killed import trained

pytestmark = pytest.mark.e2e

PROBES = 20


async def test_one_of_three_servers_dies_mid_job_and_nothing_is_lost(
    namespace: str, tmp_path: Path
) -> None:
    job = demo_job(tmp_path)
    command = list(job.spec.command)
    command[command.index("--steps") + 1] = "200"  # long enough to outlive the kills
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"command": command})})
    killed: list[str] = []
    probes_read: list[int] = []

    async def kill_a_server(bus: Bus, watch: Watch) -> None:
        supervisor = watch.supervisor
        assert supervisor is not None and len(supervisor.servers) == 3
        await watch.wait_for(trained(10), wait_seconds=90)
        sent = []
        for n in range(PROBES):  # each acknowledged: stored on a majority of servers
            probe = PhaseChanged(source=bus.source, job="probe", phase=JobPhase.RUNNING,
                                 message=f"probe {n}")  # fmt: skip
            await bus.publish(bus.subjects.action("probe"), probe)
            sent.append(probe.id)
        info = await bus.js.stream_info(bus.subjects.stream("action"))
        assert info.config.num_replicas == 3 and info.cluster is not None
        leader = info.cluster.leader
        [server] = [s for s in supervisor.servers if s.cluster and s.cluster.name == leader]
        assert server.process is not None and server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        await asyncio.to_thread(server.process.wait)
        killed.append(str(leader))
        [victim] = [o.event for o in watch.observed
                    if isinstance(o.event, ProcessStarted) and o.event.generation == 0
                    and o.event.replica == 1 and o.event.local_rank == 1]  # fmt: skip
        os.kill(victim.pid, signal.SIGKILL)

        history = await read_history(bus, job="probe", families=("action",))
        stored = [s.event.id for s in history.events]
        probes_read.append(len(set(stored) & set(sent)))

    result = await run_job(
        job, state_dir=tmp_path, namespace=namespace, nodes=2, gpus_per_node=2,
        wait_seconds=180, during=kill_a_server, nats_servers=3,
    )  # fmt: skip

    assert killed and killed[0].startswith("server-")
    assert probes_read == [PROBES], "every acknowledged message is read back after the kill"
    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == total_steps(job)
    faults = [f for f in result.events(FaultDetected) if f.job == job.name]
    assert {(f.reason, f.rank) for f in faults if f.rank is not None} >= {("process_killed", 3)}
    recoveries = [r for r in result.events(RecoveryStarted) if r.job == job.name]
    assert len(recoveries) == 1, [(r.reason, r.level) for r in recoveries]
