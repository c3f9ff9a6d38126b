"""Telemetry load for the scale curves: the agents' raw events of a job of many ranks.

Run as a script, it publishes, through the agents' path (core publishes into the raw
stream, no Nats-Msg-Id, as bench/detector_throughput.py does), one Progress per rank
per second and one GPU sample (``per_node`` GPUs) and one node report (the node
monitor's heartbeat) per node per second, for a job of
``replicas`` ranks (one each, ``per_node`` to a node), spread evenly over each second,
until terminated. It prints ``publishing`` once it has started.

On request subject :data:`SILENCE` (a JSON list of ranks) it stops those ranks'
progress for good and answers a JSON object: each rank's last progress time (epoch
seconds), the moment a hang detector's timeout counts from. On :data:`GENERATION` (a
number) every rank reports progress of that generation from then on, none silent (a
restart's new generation), and it answers ``ok``. On :data:`STATUS` it
answers how many events it sent and how far behind its schedule it runs (seconds):
behind means it could not publish the asked rate on this machine.

    python bench/scale_load.py URL NAMESPACE STREAM_REPLICAS JOB REPLICAS PER_NODE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from datetime import UTC, datetime

from nats.aio.msg import Msg

from resurge.contract.subjects import Subjects
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

__all__ = ["GENERATION", "SILENCE", "STATUS", "fill", "plans"]

SILENCE = "bench.scale.silence"
GENERATION = "bench.scale.generation"
STATUS = "bench.scale.status"


def plans(subjects: Subjects, job: str, replicas: int, per_node: int) -> list[tuple[int, str, str]]:
    """(rank or -1, subject, JSON with ``@ID@``, ``@TIME@``, ``"@GEN@"`` and
    ``"@STEP@"`` to fill in) for one second of load: every rank's progress, and after
    a node's last rank the node's GPU sample and report."""
    out: list[tuple[int, str, str]] = []
    for rank in range(replicas):
        node = f"node-{rank // per_node}"
        base = {
            "id": "@ID@",
            "schema_version": 1,
            "time": "@TIME@",
            "source": {"service": "node-agent", "instance": f"{node}:1"},
            "node": node,
        }
        progress = {
            **base,
            "kind": "progress",
            "job": job,
            "replica": rank,
            "rank": rank,
            "generation": "@GEN@",
            "local_rank": 0,
            "step": "@STEP@",
            "metrics": {"loss": 0.5},
        }
        out.append((rank, subjects.raw(job, "progress", node), json.dumps(progress)))
        if rank % per_node == per_node - 1 or rank == replicas - 1:
            gpus = [
                {"index": i, "uuid": f"sim-{node}-{i}", "utilization_percent": 90.0}
                for i in range(per_node)
            ]
            sample = {
                **base,
                "kind": "gpu_sample",
                "job": "_",
                "replica": 0,
                "rank": None,
                "gpus": gpus,
                "simulated": True,
            }
            out.append((-1, subjects.raw("_", "gpu_sample", node), json.dumps(sample)))
            report = {
                **base,
                "kind": "node_report",
                "job": "_",
                "slots_total": per_node,
                "slots_free": 0,
                "healthy": True,
            }
            out.append((-1, subjects.raw("_", "node_report", node), json.dumps(report)))
    return out


def fill(body: str, event_id: str, now: datetime, generation: bytes, step: int) -> bytes:
    """A template of :func:`plans` made a message body."""
    text = body.replace("@ID@", event_id, 1).replace("@TIME@", now.isoformat(), 1)
    text = text.replace('"@STEP@"', str(step), 1)
    return text.encode().replace(b'"@GEN@"', generation, 1)


async def publish_load(
    url: str, namespace: str, stream_replicas: int, job: str, replicas: int, per_node: int
) -> int:
    settings = Settings(nats_url=url, namespace=namespace, stream_replicas=stream_replicas)
    bus = await Bus.connect(settings, "load")
    second = plans(bus.subjects, job, replicas, per_node)
    silent: set[int] = set()
    last: dict[int, float] = {}
    prefix = uuid.uuid4().hex[:12]
    sent = 0
    began = time.monotonic()
    behind = 0.0
    generation = b"0"

    async def on_silence(msg: Msg) -> None:
        ranks = json.loads(msg.data)
        silent.update(ranks)
        await msg.respond(json.dumps({str(r): last.get(r, 0.0) for r in ranks}).encode())

    async def on_generation(msg: Msg) -> None:
        nonlocal generation
        generation = msg.data
        silent.clear()
        await msg.respond(b"ok")

    async def on_status(msg: Msg) -> None:
        await msg.respond(json.dumps({"sent": sent, "behind_seconds": behind}).encode())

    await bus.nc.subscribe(SILENCE, cb=on_silence)
    await bus.nc.subscribe(STATUS, cb=on_status)
    await bus.nc.subscribe(GENERATION, cb=on_generation)
    await bus.nc.flush()
    print("publishing", flush=True)
    while True:
        due = int((time.monotonic() - began) * len(second))
        while sent < due:
            rank, subject, body = second[sent % len(second)]
            sent += 1
            if rank in silent:
                continue
            now = datetime.now(UTC)
            step = sent // len(second)  # one step a second: a silent rank falls behind
            await bus.nc.publish(subject, fill(body, f"{prefix}{sent:012d}", now, generation, step))
            if rank >= 0:
                last[rank] = now.timestamp()
            if sent % 2000 == 0:
                await asyncio.sleep(0)  # let the requests in
        behind = max(0.0, (time.monotonic() - began) - sent / len(second))
        await bus.nc.flush()
        await asyncio.sleep(0.01)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("namespace")
    parser.add_argument("stream_replicas", type=int)
    parser.add_argument("job")
    parser.add_argument("replicas", type=int)
    parser.add_argument("per_node", type=int)
    args = parser.parse_args()
    sys.exit(
        asyncio.run(
            publish_load(
                args.url,
                args.namespace,
                args.stream_replicas,
                args.job,
                args.replicas,
                args.per_node,
            )
        )
    )
