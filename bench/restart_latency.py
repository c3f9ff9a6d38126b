"""How fast the first loop reacts: worker exit -> fault -> restart command -> new workers.

Runs the crash-once story several times on one embedded nats-server (every run in a
namespace of its own, every service a real process) and prints, per stage, the median
latency from the crashed worker's exit (as its agent saw it), and each median as a
ratio to one JetStream hop (publish -> durable push consumer) measured in the same run,
since absolute times on a shared 2-core machine are noisy.

    .venv/bin/python bench/restart_latency.py [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from resurge.events import Assign, FaultDetected, FaultScope, RecoveryFinished
from resurge.jobspec import TrainingJob
from resurge.local.job_factory import python_job
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


async def one_hop_seconds(url: str, samples: int = 50) -> float:
    """Median time of one JetStream publish -> durable push consumer delivery."""
    bus = await Bus.connect(Settings(nats_url=url, namespace="benchhop"), "bench")
    await bus.ensure_streams()
    arrived: asyncio.Queue[float] = asyncio.Queue()

    async def on(_event: FaultDetected) -> None:
        await arrived.put(time.perf_counter())

    await bus.consume(bus.subjects.all("fault"), "hop", on, expects=(FaultDetected,))
    hops = []
    for i in range(samples):
        sent = time.perf_counter()
        await bus.publish(
            bus.subjects.fault("j", "process"),
            FaultDetected(
                source=bus.source, job="j", fault_id=str(i), scope=FaultScope.PROCESS, reason="x"
            ),
        )
        hops.append(await asyncio.wait_for(arrived.get(), 10) - sent)
    await bus.close()
    return statistics.median(hops)


async def main(runs: int) -> int:
    stages: dict[str, list[float]] = {
        "exit -> fault": [],
        "exit -> restart command": [],
        "exit -> new worker started": [],
    }
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats") as server:
        hop = await one_hop_seconds(server.url)
        for run in range(runs):
            result = await run_job(
                crash_job(f"bench-{run}"),
                state_dir=Path(tmp) / str(run),
                nats_url=server.url,
                namespace=f"bench{run}",
                nodes=2,
                gpus_per_node=2,
                wait_seconds=60,
            )
            [fault] = result.faults
            exited = datetime.fromisoformat(str(fault.evidence["exited_at"]))
            assign = min(
                o.event.time
                for o in result.observed
                if isinstance(o.event, Assign) and o.event.generation == 1
            )
            [recovered] = [
                o.event for o in result.observed if isinstance(o.event, RecoveryFinished)
            ]
            stages["exit -> fault"].append((fault.time - exited).total_seconds())
            stages["exit -> restart command"].append((assign - exited).total_seconds())
            stages["exit -> new worker started"].append(
                (fault.time - exited).total_seconds() + recovered.duration_seconds
            )
    print(f"runs: {runs}; one JetStream hop (median of 50): {hop * 1000:.2f} ms")
    print(f"{'stage':<28} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'x one hop':>10}")
    for stage, values in stages.items():
        med = statistics.median(values)
        print(
            f"{stage:<28} {med * 1000:>10.1f} {min(values) * 1000:>8.1f} "
            f"{max(values) * 1000:>8.1f} {med / hop:>10.1f}"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    sys.exit(asyncio.run(main(parser.parse_args().runs)))
