"""Fan-out at cluster scale: one fault in a job of many replicas -> every replica's new Assign.

A job record of ``--replicas`` replicas (1 worker each, on 8 virtual nodes) is seeded in
the jobs bucket of a real nats-server; agents that run no workers take their commands
on ``cmd.<job>.<replica>`` as ``launch`` agents do, through a
:class:`~resurge.runtime.command_inbox.CommandInbox` each (a core subscription, caught
up from the command stream by direct gets, a position per agent), many agents to a
process, over ``--agent-processes`` processes; a real restarter process runs. Each
round publishes one process fault (about the last replica) and times until the last
replica holds its new Assign; then a worker start of the new generation closes the
recovery, and the next round begins. Printed: p50 / p99 over the rounds, first-Assign
times for comparison, and the resident memory (current and peak) of the restarter and
of nats-server.

The baseline, run first on a server of its own: the design before the inbox, one
durable consumer per agent on the command stream (start ``last_per_subject``), with
``--baseline-replicas`` replicas (0: none). nats-server (2.15) refuses a stream's
1,001st consumer ("maximum consumers limit reached", err_code 10026), so the baseline
cannot run 1,024 replicas; it runs 960 by default, and the ratios printed compare the
two at their own sizes.

``--publisher`` splits the time: ``restarter`` (the default) is the whole path above;
``bench`` has the bench publish the Assigns itself, built and sent as the restarter
does (same planner, same publishing window; no fault, no Stops), timed from the first
publish; ``whole`` does the same with the whole rank table in every Assign, as the
planner built them for every job before a job of more than 64 replicas got each
replica's own slot only: about 60 bytes per replica in each Assign (60 KB each at
1,024 replicas, 60 MB per fan-out), which its publisher encodes and every agent
decodes; ``whole`` against ``bench`` is that payload's share of the time.

    .venv/bin/python bench/fanout.py [--replicas 1024] [--rounds 10] [--agent-processes 4]
        [--baseline-replicas 960] [--publisher restarter|bench|whole]
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
from dataclasses import dataclass
from pathlib import Path

from nats.aio.msg import Msg

from resurge.control.effects.job_messages import assignment_messages, publish_all
from resurge.control.state.records import JobRecord, JobStore, Placement
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
from resurge.runtime.command_inbox import CommandInbox, position_key
from resurge.runtime.settings import Settings

NAMESPACE = "fan"
JOB = "fan"
NODES = 8
PUBLISHERS = {
    "restarter": "a real restarter, after a process fault (timed from the fault)",
    "bench": "the bench, as the restarter would, no fault (timed from the first publish)",
    "whole": "the bench, each Assign with the whole rank table (the former payload)",
}
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


async def run_agents(url: str, first: int, last: int, replicas: int, consumers: bool) -> None:
    """Agents ``first``..``last - 1``, reporting every Assign held: an inbox each (as
    ``launch`` agents have), or for the baseline a durable consumer each."""
    bus = await Bus.connect(Settings(nats_url=url, namespace=NAMESPACE), "agents")
    inboxes = []
    for replica in range(first, last):

        async def on_command(command: Assign | Stop, replica: int = replica) -> None:
            if isinstance(command, Assign):
                body = f"{command.generation} {replica} {time.time()}"
                await bus.nc.publish(GOT, body.encode())

        node = node_of(replica, replicas)
        if consumers:
            await bus.consume(
                bus.subjects.cmd(JOB, replica),
                f"agent-{JOB}-{replica}-{node}-0",
                on_command,
                expects=(Assign, Stop),
                start="last_per_subject",
                inactive_seconds=3600.0,
            )
            continue
        inbox = CommandInbox(
            bus,
            bus.subjects.cmd(JOB, replica),
            on_command,
            expects=(Assign, Stop),
            position_key=position_key(node, JOB, replica, 0),
        )
        await inbox.start()
        inboxes.append(inbox)
    await bus.nc.publish(GOT, f"ready {first} {last}".encode())
    await bus.nc.flush()
    await asyncio.Event().wait()  # until terminated


async def publish_assigns(bus: Bus, generation: int, whole_table: bool) -> float:
    """Publish Assign(``generation``) to every replica as the restarter does (the same
    planner and publishing window), or each with the whole rank table; when the first
    was sent (epoch seconds)."""
    found = await JobStore(await bus.jobs_bucket()).get(JOB)
    assert found is not None
    record = found[0]
    record.generation = generation
    record.master_port = 29500
    messages = assignment_messages(bus, record)
    if whole_table:
        table = sorted(
            (
                slot
                for _, event in messages
                if isinstance(event, Assign)
                for slot in event.rank_table
            ),
            key=lambda slot: slot.replica,
        )
        messages = [
            (subject, event.model_copy(update={"rank_table": table})) for subject, event in messages
        ]
    sent = time.time()
    await publish_all(bus, messages)
    return sent


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


@dataclass
class Run:
    """One design's figures: seconds from the fault to the last and first replica
    holding its new Assign, per round, and resident memory (now, peak) in KiB."""

    replicas: int
    to_last: list[float]
    to_first: list[float]
    setup_seconds: float
    restarter: tuple[int, int]
    nats: tuple[int, int]
    nats_idle: tuple[int, int]
    log_tail: str

    def p50(self) -> float:
        return statistics.median(self.to_last)

    def p99(self) -> float:
        ordered = sorted(self.to_last)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def measure(
    replicas: int, rounds: int, processes: int, consumers: bool, publisher: str = "restarter"
) -> Run:
    """Run the scenario once: agents with an inbox each, or a consumer each. The
    Assigns come from the restarter after a fault, or (``publisher`` ``bench`` or
    ``whole``) from the bench itself, as the planner builds them or each with the whole
    rank table."""
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
                        *(["--consumers"] if consumers else []),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        restarter = (
            subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", "resurge_restarter"],
                env={**env, "RESURGE_METRICS_PORT": str(free_port())},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            if publisher == "restarter"
            else None
        )
        processes_started = [*children, *([restarter] if restarter is not None else [])]
        try:
            await until(lambda: len(ready) == len(children), 300, "the agents' intakes")
            consumers_in = time.monotonic() - began
            while publisher == "restarter":  # the restarter is up once its fault consumer is
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
                if publisher != "restarter":
                    new = generation + 1
                    sent = await publish_assigns(bus, new, whole_table=publisher == "whole")
                    await until(
                        lambda new=new: len(held.get(new, {})) == replicas, 120, "every Assign"
                    )
                    to_last.append(max(held[new].values()) - sent)
                    to_first.append(min(held[new].values()) - sent)
                    continue
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
            restarter_rss = rss_kib(restarter.pid) if restarter is not None else (0, 0)
            nats_rss = rss_kib(server.process.pid)
        finally:
            for child in processes_started:
                child.terminate()
            for child in processes_started:
                try:
                    child.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()
            await bus.close()
            log.close()
            tail = (Path(tmp) / "children.log").read_text()[-1500:]
    return Run(
        replicas,
        to_last,
        to_first,
        consumers_in,
        restarter_rss,
        nats_rss,
        nats_idle,
        tail,
    )


def describe(name: str, run: Run, rounds: int, publisher: str) -> None:
    if "Traceback" in run.log_tail:
        print("agents' and restarter's log (end):", run.log_tail)
    if "maximum consumers limit reached" in run.log_tail:
        print("some agents could not bind their command consumer: the stream's limit")
    print(
        f"{name}: replicas {run.replicas} on {NODES} nodes; agents ready in "
        f"{run.setup_seconds:.1f} s; rounds {rounds}"
    )
    print(
        f"  {'fault' if publisher == 'restarter' else 'first publish'} -> last replica "
        f"holds its new Assign: p50 {run.p50() * 1000:.0f} ms, "
        f"p99 {run.p99() * 1000:.0f} ms (max of {rounds}; goal p99 <= 250 ms); "
        f"-> first replica: p50 {statistics.median(run.to_first) * 1000:.0f} ms"
    )
    print(
        f"  RSS now / peak: restarter {run.restarter[0] / 1024:.0f} / "
        f"{run.restarter[1] / 1024:.0f} MiB (0: none ran); nats-server {run.nats[0] / 1024:.0f} / "
        f"{run.nats[1] / 1024:.0f} MiB (agents ready, before any fault: "
        f"{run.nats_idle[0] / 1024:.0f} MiB)"
    )


async def main(
    replicas: int, rounds: int, processes: int, baseline_replicas: int, publisher: str
) -> int:
    print(f"{processes} agent processes; Assigns from {PUBLISHERS[publisher]}")
    baseline = None
    if baseline_replicas:
        baseline = await measure(baseline_replicas, rounds, processes, True, publisher)
        describe("baseline, a consumer per agent", baseline, rounds, publisher)
    run = await measure(replicas, rounds, processes, False, publisher)
    describe("a command inbox per agent", run, rounds, publisher)
    if baseline is not None:
        print(
            f"inbox ({replicas} replicas) / baseline ({baseline_replicas}): "
            f"p50 x{run.p50() / baseline.p50():.2f}, p99 x{run.p99() / baseline.p99():.2f}, "
            f"nats-server peak RSS x{run.nats[1] / baseline.nats[1]:.2f}"
            + (
                f", restarter peak RSS x{run.restarter[1] / baseline.restarter[1]:.2f}"
                if baseline.restarter[1]
                else ""
            )
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--agent-processes", type=int, default=4)
    parser.add_argument(
        "--baseline-replicas",
        type=int,
        default=960,
        help="replicas of the baseline run, a consumer per agent (0: no baseline)",
    )
    parser.add_argument(
        "--publisher",
        choices=sorted(PUBLISHERS),
        default="restarter",
        help="who sends the Assigns: " + "; ".join(f"{k}: {v}" for k, v in PUBLISHERS.items()),
    )
    parser.add_argument("--agents", type=int, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--consumers", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agents:
        first, last = args.agents
        asyncio.run(run_agents(args.url, first, last, args.replicas, args.consumers))
    sys.exit(
        asyncio.run(
            main(
                args.replicas,
                args.rounds,
                args.agent_processes,
                args.baseline_replicas,
                args.publisher,
            )
        )
    )
