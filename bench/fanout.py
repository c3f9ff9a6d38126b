"""Fan-out at cluster scale: one fault in a job of many replicas -> every replica's new Assign.

A job record of ``--replicas`` replicas (1 worker each, on 8 virtual nodes) is seeded in
the jobs bucket of a real nats-server; agents that run no workers hold one durable
command consumer each on ``cmd.<job>.<replica>`` (as ``launch`` agents do: start
``last_per_subject``, an inactivity threshold), many agents to a process, over
``--agent-processes`` processes; a real restarter process runs. Each round publishes one
process fault (about the last replica) and times until the last replica holds its new
Assign; then a worker start of the new generation closes the recovery, and the next
round begins. Printed: p50 / p99 over the rounds, first-Assign times for comparison,
and the resident memory (current and peak) of the restarter and of nats-server.

    .venv/bin/python bench/fanout.py [--replicas 1024] [--rounds 10] [--agent-processes 4]

nats-server (2.15) refuses a stream's 1,001st consumer ("maximum consumers limit
reached", err_code 10026), and every agent of every job holds one on the one command
stream: at 1,024 replicas the last agents cannot bind, and the bench says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nats.aio.msg import Msg

from resurge.control.records import JobRecord, JobStore, Placement
from resurge.events import (
    Assign,
    Event,
    FaultDetected,
    FaultScope,
    JobPhase,
    ProcessStarted,
    RecoveryFinished,
    Stop,
)
from resurge.local.job_factory import job
from resurge.local.nats_server import NatsServer
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

NAMESPACE = "fan"
JOB = "fan"
NODES = 8
GOT = "bench.fanout.got"  # core NATS: agents report each Assign they hold here


def rss_kib(pid: int) -> tuple[int, int]:
    """Resident set size now and at its peak, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()[0] if value.split() else "0"
    return int(fields.get("VmRSS", 0)), int(fields.get("VmHWM", 0))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_of(replica: int, replicas: int) -> str:
    return f"node-{replica * NODES // replicas}"


async def run_agents(url: str, first: int, last: int, replicas: int) -> None:
    """Agents ``first``..``last - 1``: one consumer each, reporting every Assign held."""
    bus = await Bus.connect(Settings(nats_url=url, namespace=NAMESPACE), "agents")
    for replica in range(first, last):

        async def on_command(command: Assign | Stop, replica: int = replica) -> None:
            if isinstance(command, Assign):
                body = f"{command.generation} {replica} {time.time()}"
                await bus.nc.publish(GOT, body.encode())

        await bus.consume(
            bus.subjects.cmd(JOB, replica),
            f"agent-{JOB}-{replica}-{node_of(replica, replicas)}-0",
            on_command,
            expects=(Assign, Stop),
            start="last_per_subject",
            inactive_seconds=3600.0,
        )
    await bus.nc.publish(GOT, f"ready {first} {last}".encode())
    await bus.nc.flush()
    await asyncio.Event().wait()  # until terminated


async def seed(bus: Bus, replicas: int) -> None:
    spec = job(
        JOB,
        nproc=1,
        replicas=replicas,
        recovery={  # every round a process restart (no escalation up the ladder), at once
            "levels": ["process"],
            "maxRestartsPerLevel": {"process": 10_000},
            "backoff": {"initialSeconds": 0, "maxSeconds": 0},
        },
    )
    record = JobRecord(
        name=JOB,
        spec=spec,
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=r, node=node_of(r, replicas)) for r in range(replicas)],
    )
    await JobStore(await bus.jobs_bucket()).create(record)


async def main(replicas: int, rounds: int, processes: int) -> int:
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats") as server:
        assert server.process is not None
        settings = Settings(nats_url=server.url, namespace=NAMESPACE)
        bus = await Bus.connect(settings, "bench")
        await bus.ensure_streams()
        await seed(bus, replicas)
        held: dict[int, dict[int, float]] = {}
        ready: list[str] = []
        arrived = asyncio.Event()

        async def on_got(msg: Msg) -> None:
            text = msg.data.decode()
            if text.startswith("ready"):
                ready.append(text)
            else:
                generation, replica, at = text.split()
                held.setdefault(int(generation), {})[int(replica)] = float(at)
            arrived.set()

        await bus.nc.subscribe(GOT, cb=on_got)
        finished: dict[int, RecoveryFinished] = {}

        async def on_action(event: Event, _subject: str) -> None:
            if isinstance(event, RecoveryFinished) and event.generation is not None:
                finished[event.generation] = event
                arrived.set()

        await bus.subscribe(bus.subjects.action(JOB), on_action)

        async def until(test: object, seconds: float, what: str) -> None:
            deadline = time.monotonic() + seconds
            while not test():  # type: ignore[operator]
                arrived.clear()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"waiting for {what}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), left)

        env = {
            **os.environ,
            "RESURGE_NATS_URL": server.url,
            "RESURGE_NAMESPACE": NAMESPACE,
            "RESURGE_LOG_LEVEL": "WARNING",
            "RESURGE_LOG_FORMAT": "text",
        }
        per = -(-replicas // processes)
        children = []
        log = (Path(tmp) / "children.log").open("wb")
        began = time.monotonic()
        for first in range(0, replicas, per):
            children.append(
                subprocess.Popen(  # noqa: ASYNC220 (started once, before the timed part)
                    [
                        *(sys.executable, __file__, "--agents", str(first), str(first + per)),
                        *("--url", server.url, "--replicas", str(replicas)),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        restarter = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "resurge_restarter"],
            env={**env, "RESURGE_METRICS_PORT": str(free_port())},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            await until(lambda: len(ready) == len(children), 300, "the agents' consumers")
            consumers_in = time.monotonic() - began
            while True:  # the restarter is up once its fault consumer exists
                try:
                    await bus.js.consumer_info(bus.subjects.stream("fault"), "restarter")
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            nats_idle = rss_kib(server.process.pid)
            last_replica = replicas - 1
            to_last: list[float] = []
            to_first: list[float] = []
            for generation in range(rounds):
                fault = FaultDetected(
                    source=bus.source,
                    job=JOB,
                    fault_id=f"bench-{generation}",
                    scope=FaultScope.PROCESS,
                    reason="process_crash",
                    generation=generation,
                    replica=last_replica,
                    node=node_of(last_replica, replicas),
                )
                sent = time.time()
                await bus.publish(bus.subjects.fault(JOB, "process"), fault)
                new = generation + 1
                await until(
                    lambda new=new: len(held.get(new, {})) == replicas,
                    120,
                    "every Assign",
                )
                times = held[new]
                to_last.append(max(times.values()) - sent)
                to_first.append(min(times.values()) - sent)
                started = ProcessStarted(
                    source=bus.source,
                    job=JOB,
                    replica=0,
                    node=node_of(0, replicas),
                    generation=new,
                    rank=0,
                    pid=1,
                    local_rank=0,
                    local_world_size=1,
                )
                await bus.publish(
                    bus.subjects.raw(JOB, "process_started", node_of(0, replicas)), started
                )
                await until(
                    lambda new=new: new in finished,
                    60,
                    "the recovery to close",
                )
            restarter_rss = rss_kib(restarter.pid)
            nats_rss = rss_kib(server.process.pid)
        finally:
            for child in [*children, restarter]:
                child.terminate()
            for child in [*children, restarter]:
                try:
                    child.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()
            await bus.close()
            log.close()
            tail = (Path(tmp) / "children.log").read_text()[-1500:]
    if "Traceback" in tail:
        print("agents' and restarter's log (end):", tail)
    if "maximum consumers limit reached" in tail:
        print("some agents could not bind their command consumer: the stream's limit")
    ordered = sorted(to_last)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    print(
        f"replicas {replicas} on {NODES} nodes, {processes} agent processes; "
        f"{replicas} command consumers bound in {consumers_in:.1f} s; rounds {rounds}"
    )
    print(
        f"fault -> last replica holds its new Assign: p50 {statistics.median(to_last) * 1000:.0f}"
        f" ms, p99 {p99 * 1000:.0f} ms (max of {rounds}; goal p99 <= 250 ms); "
        f"-> first replica: p50 {statistics.median(to_first) * 1000:.0f} ms"
    )
    print(
        f"RSS now / peak: restarter {restarter_rss[0] / 1024:.0f} / "
        f"{restarter_rss[1] / 1024:.0f} MiB; nats-server {nats_rss[0] / 1024:.0f} / "
        f"{nats_rss[1] / 1024:.0f} MiB (with the consumers bound, before any fault: "
        f"{nats_idle[0] / 1024:.0f} MiB)"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--agent-processes", type=int, default=4)
    parser.add_argument("--agents", type=int, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agents:
        first, last = args.agents
        asyncio.run(run_agents(args.url, first, last, args.replicas))
    sys.exit(asyncio.run(main(args.replicas, args.rounds, args.agent_processes)))
