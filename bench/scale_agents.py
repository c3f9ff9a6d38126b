"""Simulated launch agents for the scale curves: many replicas in one process, no workers.

Run as a script, one process holds the agents of replicas ``FIRST`` to ``LAST - 1`` of
one job, each replica on node ``node-<replica // per_node>`` (from ``--spare-from K``
on, the node of replica K: a grow adds replicas of new numbers on a free node). Each
agent takes its
commands on ``cmd.<job>.<replica>`` through a
:class:`~resurge.runtime.command_inbox.CommandInbox`, as ``launch`` agents do, and
tells the bench on core subject :data:`GOT` (``assign GEN REPLICA HELD STEPPED``,
epoch seconds) when it holds an Assign. With ``--respond`` it also answers what the
control plane waits for from a replica, at once, with no worker behind it:

- its worker group written in the local backend's bucket (a grow's warm-up) ->
  AgentStateChanged ``waiting``, the scaler's sign that the replica is up;
- CheckpointNow of its generation -> CheckpointSaved of the step it is at (world size:
  its generation's), which the restarter counts into the job record;
- Assign -> Progress of the new generation, one step past the resume point (the
  generation's first step, which ends a recovery or a resize): ``STEPPED`` is when it
  was sent. A real replica would start workers and pass a rendezvous in between; this
  one measures the control plane alone.

It says ``ready FIRST LAST`` on :data:`GOT` once every inbox (and the watch) is up, and
runs until terminated.

    python bench/scale_agents.py URL NAMESPACE STREAM_REPLICAS JOB FIRST LAST PER_NODE
        [--respond] [--spare-from K]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import nats.errors

from resurge.cluster.local.keys import WORKER_GROUPS_BUCKET, parse_worker_group_key
from resurge.events import (
    AgentState,
    AgentStateChanged,
    Assign,
    CheckpointNow,
    CheckpointSaved,
    Envelope,
    Progress,
    Stop,
)
from resurge.runtime.bus import Bus
from resurge.runtime.command_inbox import CommandInbox, position_key
from resurge.runtime.settings import Settings

__all__ = ["GOT", "node_of"]

GOT = "bench.scale.got"  # core NATS: agents report each Assign they hold here


def node_of(replica: int, per_node: int, spare_from: int | None = None) -> str:
    """The node a replica runs on: ``per_node`` replicas to a node, in order; from
    replica ``spare_from`` on (those a grow adds), the node of replica ``spare_from``."""
    if spare_from is not None:
        replica = min(replica, spare_from)
    return f"node-{replica // per_node}"


class Agent:
    """One replica's simulated agent: its generation, step and world size."""

    def __init__(self, bus: Bus, job: str, replica: int, node: str, respond: bool) -> None:
        self.bus, self.job, self.replica, self.node = bus, job, replica, node
        self.respond = respond
        self.generation = 0
        self.step = 0
        self.world: int | None = None

    async def _send(self, event: Envelope) -> None:
        await self.bus.publish_nowait(self.bus.subjects.raw(self.job, event.kind, self.node), event)

    def _progress(self) -> Progress:
        return Progress(
            source=self.bus.source,
            job=self.job,
            replica=self.replica,
            node=self.node,
            generation=self.generation,
            rank=self.replica,
            local_rank=0,
            step=self.step,
        )

    async def on_command(self, command: Assign | Stop | CheckpointNow) -> None:
        if isinstance(command, Assign):
            held = time.time()
            if command.generation <= self.generation and self.step > 0:
                return  # an old one, caught up after a newer
            self.generation = command.generation
            self.world = command.world_size
            self.step = (command.resume_step or 0) + 1
            stepped = 0.0
            if self.respond:
                await self._send(self._progress())
                stepped = time.time()
            body = f"assign {command.generation} {self.replica} {held} {stepped}"
            await self.bus.nc.publish(GOT, body.encode())
        elif isinstance(command, CheckpointNow) and self.respond:
            if command.generation != self.generation:
                return
            saved = CheckpointSaved(
                source=self.bus.source,
                job=self.job,
                replica=self.replica,
                node=self.node,
                generation=self.generation,
                rank=self.replica,
                local_rank=0,
                step=self.step,
                path="sim://scale-curves",
                world_size=self.world,
            )
            await self._send(saved)

    async def waiting(self) -> None:
        state = AgentStateChanged(
            source=self.bus.source,
            job=self.job,
            replica=self.replica,
            node=self.node,
            generation=self.generation,
            state=AgentState.WAITING,
            detail="simulated",
        )
        await self._send(state)


async def watch_groups(bus: Bus, job: str, agents: dict[int, Agent]) -> asyncio.Event:
    """Say ``waiting`` for each of ``agents`` whose worker group is written from now on
    (a grow's warm-up); set the returned event once the groups there now were read."""
    kv = await bus.create_bucket(WORKER_GROUPS_BUCKET)
    watcher = await kv.watchall(ignore_deletes=True)
    caught_up = asyncio.Event()

    async def pump() -> None:
        async for entry in watcher:
            if entry is None:  # the end of what the bucket held when the watch began
                caught_up.set()
                continue
            if not entry.value or not caught_up.is_set():
                continue
            _node, group_job, replica = parse_worker_group_key(entry.key)
            if group_job == job and replica in agents:
                await agents[replica].waiting()

    asyncio.get_running_loop().create_task(pump())
    return caught_up


async def _start(inbox: CommandInbox, attempts: int = 5) -> None:
    """Start ``inbox``, again after a JetStream request timed out (thousands of agents
    starting at once on a loaded machine: a real agent is started again by its
    monitor)."""
    for attempt in range(attempts):
        try:
            await inbox.start()
            return
        except nats.errors.TimeoutError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(1.0)


async def run_agents(
    url: str,
    namespace: str,
    stream_replicas: int,
    job: str,
    first: int,
    last: int,
    per_node: int,
    respond: bool,
    spare_from: int | None,
) -> None:
    settings = Settings(nats_url=url, namespace=namespace, stream_replicas=stream_replicas)
    bus = await Bus.connect(settings, "agents")
    agents = {
        r: Agent(bus, job, r, node_of(r, per_node, spare_from), respond) for r in range(first, last)
    }
    if respond:
        await (await watch_groups(bus, job, agents)).wait()
    inboxes = []
    for replica, agent in agents.items():
        inbox = CommandInbox(
            bus,
            bus.subjects.cmd(job, replica),
            agent.on_command,
            expects=(Assign, Stop, CheckpointNow),
            position_key=position_key(agent.node, job, replica, 0),
        )
        await _start(inbox)
        inboxes.append(inbox)
    await bus.nc.publish(GOT, f"ready {first} {last}".encode())
    await bus.nc.flush()
    await asyncio.Event().wait()  # until terminated


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("namespace")
    parser.add_argument("stream_replicas", type=int)
    parser.add_argument("job")
    parser.add_argument("first", type=int)
    parser.add_argument("last", type=int)
    parser.add_argument("per_node", type=int)
    parser.add_argument("--respond", action="store_true")
    parser.add_argument("--spare-from", type=int)
    args = parser.parse_args()
    sys.exit(
        asyncio.run(
            run_agents(
                args.url,
                args.namespace,
                args.stream_replicas,
                args.job,
                args.first,
                args.last,
                args.per_node,
                args.respond,
                args.spare_from,
            )
        )
        or 0
    )
