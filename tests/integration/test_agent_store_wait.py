"""An agent whose replica has no rank 0 starts its workers only once the generation's
rendezvous store, which another agent hosts, accepts connections: a torch store client
refused once backs off for half a second, and the whole generation with it.

A real agent process (its fork server preloads torch, as rank 0's agent must to host
the store); the store is a plain listening socket the test opens.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.events import (
    AgentState,
    AgentStateChanged,
    Assign,
    LogLine,
    ProcessExited,
    ProcessStarted,
    ReplicaSlot,
    Stop,
)
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.collect import Events
from tests.integration.agent_process import free_port, launch_agent

JOB = "storewait"


def start_agent(settings: Settings, tmp_path: Path) -> subprocess.Popen[bytes]:
    """The agent of replica 1 (rank 1 of 2), one worker that says it started."""
    spec = WorkerGroupSpec(
        job=JOB,
        replica=1,
        node="n1",
        nproc=1,
        command=[sys.executable, "-c", "print('worker started', flush=True)"],
        stop_grace_seconds=1.0,
        preload=["torch"],  # what lets rank 0's agent host the store
    )
    return launch_agent(settings, spec, tmp_path / "agent.log")


def waiting_for_store(items: Sequence[object]) -> bool:
    return any(
        isinstance(e, AgentStateChanged)
        and e.state is AgentState.WAITING
        and "rendezvous store" in e.detail
        for e in items
    )


async def test_workers_start_once_the_store_of_rank_0s_agent_listens(
    bus: Bus, settings: Settings, raw_events: Events, tmp_path: Path
) -> None:
    port = free_port()
    agent = start_agent(settings, tmp_path)
    store = None
    try:
        await bus.publish(
            bus.subjects.cmd(JOB, 1),
            Assign(
                source=bus.source,
                job=JOB,
                replica=1,
                generation=0,
                world_size=2,
                rank_table=[
                    ReplicaSlot(replica=0, node="n0", first_rank=0, nproc=1),
                    ReplicaSlot(replica=1, node="n1", first_rank=1, nproc=1),
                ],
                master_addr="127.0.0.1",
                master_port=port,
            ),
        )
        # Whichever comes first: the agent says it waits, or (wrongly) a worker starts.
        await raw_events.wait_for(
            lambda items: waiting_for_store(items) or raw_events.of(ProcessStarted), 60
        )
        assert raw_events.of(ProcessStarted) == []
        assert waiting_for_store(raw_events.items)
        store = socket.create_server(("127.0.0.1", port))
        started = await raw_events.wait_for(lambda items: raw_events.of(ProcessStarted), 60)
        assert [(e.rank, e.generation) for e in started] == [(1, 0)]
        await raw_events.wait_for(
            lambda items: any(isinstance(e, LogLine) and e.line == "worker started" for e in items)
        )
        await raw_events.wait_for(lambda items: raw_events.of(ProcessExited))
        await bus.publish(
            bus.subjects.cmd(JOB, 1),
            Stop(source=bus.source, job=JOB, replica=1, generation=0, final=True),
        )
        assert await asyncio.to_thread(agent.wait, 60) == 0
    finally:
        agent.kill()
        if store is not None:
            store.close()
