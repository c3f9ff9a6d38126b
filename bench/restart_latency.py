"""How fast the first loop reacts: worker exit -> fault -> restart command -> new workers.

Runs the crash-once story several times on one embedded nats-server (every run in a
namespace of its own, every service a real process) and prints, per stage, the median
latency from the crashed worker's exit (as its agent saw it), and each median as a
ratio to two baselines measured in the same run, since absolute times on a shared
2-core machine are noisy: one JetStream hop (publish -> durable push consumer, back to
back in one process) and one round trip between two processes that were idle (a core
message there and back, 10 ms apart: what waking a sleeping process costs on this
machine, paid at every hop of the fault's path).

``--background RATE``: every run is done twice, on ``--nodes`` nodes (default 8), once
quiet and once while a publisher process sends RATE raw events per second per node of
realistic telemetry (GPU samples, progress and log lines of a running job seeded beside
the crashing one, through the agents' path), and p50 / p99 of both are printed side by
side.

    .venv/bin/python bench/restart_latency.py [--runs 5] [--background RATE] [--nodes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from idle_baselines import idle_round_trip_seconds, one_hop_seconds
from published import record

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import Assign, JobPhase, RecoveryFinished
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import job, python_job
from resurge.local.nats_server import NatsServer
from resurge.local.story import run_job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings


def crash_job(name: str) -> TrainingJob:
    """The demo worker, 2 replicas x 2 ranks, rank 1 crashing at step 3 of 10."""
    return python_job(
        name,
        "-m resurge.local.demo_worker",
        *("--steps", "10", "--crash-rank", "1", "--crash-step", "3"),
        nproc=2,
        replicas=2,
        recovery={"jobMaxRetryCount": 2, "stopGraceSeconds": 5},
    )


BACKGROUND_JOB = "background"
STAGES = ("exit -> fault", "exit -> restart command", "exit -> new worker started")


def node_name(index: int) -> str:
    """The supervisor's name for its ``index``-th virtual node."""
    return f"node-{index}"


def templates(bus: Bus, nodes: int) -> list[tuple[str, str]]:
    """Per node: one GPU sample, three progress reports and six log lines in ten (subject,
    JSON with ``@ID@`` and ``@TIME@`` to fill in) pairs, as agents publish them."""
    out = []
    for n in range(nodes):
        node = node_name(n)
        base = {
            "schema_version": 1,
            "source": {"service": "node-agent", "instance": f"{node}:1"},
            "replica": n,
            "node": node,
            "generation": 0,
        }
        gpus = [{"index": i, "uuid": f"sim-{n}-{i}", "utilization_percent": 90.0} for i in range(2)]
        progress: dict[str, object] = {"step": 10, "metrics": {"loss": 0.5}}
        line: dict[str, object] = {"stream": "stdout", "line": "step 10 loss 0.5 lr 0.001"}
        ranked = {"job": BACKGROUND_JOB, "rank": n, "local_rank": 0}
        kinds: list[tuple[str, dict[str, object]]] = [
            ("gpu_sample", {"job": "_", "rank": None, "gpus": gpus, "simulated": True}),
            *[("progress", {**ranked, **progress})] * 3,
            *[("log_line", {**ranked, **line})] * 6,
        ]
        for kind, extra in kinds:
            body = {"id": "@ID@", "kind": kind, "time": "@TIME@", **base, **extra}
            out.append((bus.subjects.raw(str(body["job"]), kind, node), json.dumps(body)))
    return out


async def publish_background(url: str, namespace: str, nodes: int, rate: float) -> int:
    """Publish ``rate`` raw events per second per node until killed (the hidden mode)."""
    bus = await Bus.connect(Settings(nats_url=url, namespace=namespace), "background")
    await bus.ensure_streams()
    plans = templates(bus, nodes)
    prefix = uuid.uuid4().hex[:12]
    sent = 0
    began = time.monotonic()
    print("publishing", flush=True)
    while True:
        due = int((time.monotonic() - began) * rate * nodes)
        while sent < due:
            subject, body = plans[sent % len(plans)]
            event_id = f"{prefix}{sent:012d}"
            now = datetime.now(UTC).isoformat()
            payload = body.replace("@ID@", event_id).replace("@TIME@", now).encode()
            await bus.nc.publish(subject, payload)  # as agents send telemetry: no Msg-Id
            sent += 1
        await bus.nc.flush()
        await asyncio.sleep(0.01)


async def seed_background_job(bus: Bus, nodes: int) -> None:
    """A running job with one replica per node, whose telemetry the background is."""
    spec = job(BACKGROUND_JOB, replicas=nodes, monitoring={"heartbeatTimeoutSeconds": 3600})
    record = JobRecord(
        name=BACKGROUND_JOB,
        spec=spec,
        phase=JobPhase.RUNNING,
        placements=[Placement(replica=n, node=node_name(n)) for n in range(nodes)],
    )
    await JobStore(await bus.jobs_bucket()).create(record)


async def one_run(
    tmp: Path, url: str, name: str, nodes: int, background: float
) -> dict[str, float]:
    """One crash-once story; with ``background`` > 0 beside a background publisher."""
    publisher = None
    if background:
        publisher = subprocess.Popen(  # noqa: ASYNC220 (started before the timed part)
            [sys.executable, __file__, "--publish", url, name, str(nodes), str(background)],
            stdout=subprocess.PIPE,
        )
        assert publisher.stdout is not None
        await asyncio.to_thread(publisher.stdout.readline)  # "publishing"

    async def seed(bus: Bus) -> None:
        await seed_background_job(bus, nodes)

    try:
        result = await run_job(
            crash_job(name),
            state_dir=tmp / name,
            nats_url=url,
            namespace=name,
            nodes=nodes,
            gpus_per_node=4,  # the background job holds one slot of each node
            wait_seconds=90,
            before_submit=seed,
        )
    finally:
        if publisher is not None:
            publisher.kill()
            publisher.wait()
    [fault] = result.faults
    exited = datetime.fromisoformat(str(fault.evidence["exited_at"]))
    assign = min(
        o.event.time
        for o in result.observed
        if isinstance(o.event, Assign) and o.event.generation == 1
    )
    [recovered] = [o.event for o in result.observed if isinstance(o.event, RecoveryFinished)]
    to_fault = (fault.time - exited).total_seconds()
    return {
        STAGES[0]: to_fault,
        STAGES[1]: (assign - exited).total_seconds(),
        STAGES[2]: to_fault + recovered.duration_seconds,
    }


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def main(runs: int, background: float, nodes: int) -> int:
    loads = [0.0, background] if background else [0.0]
    stages: dict[float, dict[str, list[float]]] = {
        load: {stage: [] for stage in STAGES} for load in loads
    }
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats") as server:
        hop = await one_hop_seconds(Settings(nats_url=server.url, namespace="benchhop"))
        trip = await idle_round_trip_seconds(Settings(nats_url=server.url, namespace="benchecho"))
        for run in range(runs):
            for i, load in enumerate(loads):  # interleaved: both see the same machine
                took = await one_run(Path(tmp), server.url, f"bench{run}x{i}", nodes, load)
                for stage, value in took.items():
                    stages[load][stage].append(value)
    print(f"runs: {runs} on {nodes} nodes; one JetStream hop (median of 50): {hop * 1000:.2f} ms")
    print(f"round trip between two idle processes (median of 100): {trip * 1000:.2f} ms")
    print(
        f"{'stage':<28} {'background /s/node':>18} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'min ms':>8} {'max ms':>8} {'p50 x hop':>10} {'p50 x trip':>10}"
    )
    for stage in STAGES:
        for load in loads:
            values = stages[load][stage]
            med = statistics.median(values)
            print(
                f"{stage:<28} {load:>18.0f} {med * 1000:>8.1f} {p99(values) * 1000:>8.1f} "
                f"{min(values) * 1000:>8.1f} {max(values) * 1000:>8.1f} {med / hop:>10.1f} "
                f"{med / trip:>10.1f}"
            )
    if runs < 100:
        print(f"(p99 of {runs} runs is their maximum)")
    figures = {}
    for load in loads:
        suffix = f"_beside_{background:g}_per_node" if load else ""
        for stage, key in zip(STAGES, ("fault", "command", "worker"), strict=True):
            values = stages[load][stage]
            figures[f"exit_to_{key}_p50_ms{suffix}"] = (
                round(statistics.median(values) * 1e3, 2),
                "ms",
            )
            figures[f"exit_to_{key}_p99_ms{suffix}"] = (round(p99(values) * 1e3, 2), "ms")
            figures[f"exit_to_{key}_p50_x_hop{suffix}"] = (
                round(statistics.median(values) / hop, 2),
                "x",
            )
    print(f"recorded in {record('restart_latency', figures)}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--background",
        type=float,
        default=0,
        metavar="RATE",
        help="also run every story beside RATE raw events per second per node",
    )
    parser.add_argument("--nodes", type=int, help="default: 8 with --background, else 2")
    parser.add_argument("--publish", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        url, namespace, nodes, rate = args.publish
        sys.exit(asyncio.run(publish_background(url, namespace, int(nodes), float(rate))))
    nodes = args.nodes or (8 if args.background else 2)
    sys.exit(asyncio.run(main(args.runs, args.background, nodes)))
