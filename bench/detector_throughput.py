"""Detector throughput and hang-detection latency, through a real nats-server.

A load generator publishes progress, log-line and GPU-sample events for many jobs and
ranks (the agents' path for telemetry: core publishes into the raw stream, each sent
once, without a Nats-Msg-Id) into one detector process. Midway, some ranks go silent;
the detector must report each as a hang. Printed:

- events per second per core: events the detector consumed / the CPU seconds its
  process used (utime + stime from /proc) while it consumed them;
- zero drops: every published event is in the stream and was consumed and acked;
- hang detection latency p50 / p99: fault event time minus the silent rank's last
  progress time, against the heartbeat timeout;
- the same read path with no detection (a bare batch reader in this process) as the
  baseline ratio.

    .venv/bin/python bench/detector_throughput.py [--jobs 50] [--ranks 8] [--events 300000]
        [--rate EVENTS_PER_SECOND]

Throughput is best read at an unlimited rate (the detector runs flat out); hang latency
at a rate the detector keeps up with, since a backlog delays every judgement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import Event, FaultDetected, JobPhase, Source
from resurge.local.job_factory import job
from resurge.local.nats_server import NatsServer
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

NAMESPACE = "dtb"
HEARTBEAT_TIMEOUT = 2.0
SOURCE = Source(service="node-agent", instance="bench:1")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def template(kind: str, job: str, rank: int, extra: dict[str, object]) -> str:
    """The event as JSON with ``@ID@`` and ``@TIME@`` left to fill in per message."""
    body = {
        "id": "@ID@",
        "kind": kind,
        "schema_version": 1,
        "time": "@TIME@",
        "source": {"service": SOURCE.service, "instance": SOURCE.instance},
        "job": job if kind != "gpu_sample" else "_",
        "replica": 0,
        "node": f"node-{rank % 10}",
        "rank": rank if kind != "gpu_sample" else None,
        "generation": 0,
        **extra,
    }
    return json.dumps(body)


async def seed_jobs(bus: Bus, jobs: int, ranks: int) -> list[str]:
    store = JobStore(await bus.jobs_bucket())
    names = []
    for j in range(jobs):
        name = f"job-{j}"
        spec = job(
            name,
            nproc=ranks,
            monitoring={
                "heartbeatTimeoutSeconds": HEARTBEAT_TIMEOUT,
                "logRules": [{"name": "cuda", "logPattern": "CUDA error", "faultOnMatch": True}],
                "straggler": {"enabled": True},
            },
            preload=None,
        )
        record = JobRecord(
            name=name,
            spec=spec,
            phase=JobPhase.RUNNING,
            placements=[Placement(replica=0, node=f"node-{j % 10}")],
        )
        await store.create(record)
        names.append(name)
    return names


async def generate(
    bus: Bus,
    names: list[str],
    ranks: int,
    total: int,
    silent: set[tuple[str, int]],
    last_progress: dict[tuple[str, int], float],
    rate: float,
) -> int:
    """Publish ``total`` events round-robin at ``rate`` per second (0: as fast as possible);
    ranks in ``silent`` stop after half of them."""
    subjects = bus.subjects
    plans = []
    for name in names:
        for rank in range(ranks):
            plans.append(
                (
                    "progress",
                    name,
                    rank,
                    subjects.raw(name, "progress", f"node-{rank % 10}"),
                    template(
                        "progress",
                        name,
                        rank,
                        {"local_rank": rank, "step": 0, "metrics": {"loss": 0.5}},
                    ),
                )
            )
            plans.append(
                (
                    "log_line",
                    name,
                    rank,
                    subjects.raw(name, "log_line", f"node-{rank % 10}"),
                    template(
                        "log_line",
                        name,
                        rank,
                        {
                            "local_rank": rank,
                            "stream": "stdout",
                            "line": "step 10 loss 0.5 lr 0.001",
                        },
                    ),
                )
            )
    for node in range(10):
        gpus = [
            {"index": i, "uuid": f"sim-{node}-{i}", "utilization_percent": 90.0} for i in range(8)
        ]
        plans.append(
            (
                "gpu_sample",
                "_",
                0,
                subjects.raw("_", "gpu_sample", f"node-{node}"),
                template("gpu_sample", "_", 0, {"gpus": gpus, "simulated": True}),
            )
        )
    sent = 0
    prefix = uuid.uuid4().hex[:16]
    began = time.monotonic()
    while sent < total:
        for kind, name, rank, subject, body in plans:
            if sent >= total:
                break
            if sent > total // 2 and (name, rank) in silent:
                continue
            now = datetime.now(UTC)
            event_id = f"{prefix}{sent:012d}"
            payload = body.replace("@ID@", event_id).replace("@TIME@", now.isoformat()).encode()
            await bus.nc.publish(subject, payload)
            if kind == "progress":
                last_progress[(name, rank)] = now.timestamp()
            sent += 1
            if sent % 1000 == 0:
                await bus.nc.flush()
                if rate:  # pace: where the schedule says we should be
                    ahead = sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
    await bus.nc.flush()
    return sent


async def bare_read_rate(bus: Bus, count: int) -> float:
    """The baseline: the same stream read (push, ack-all) with no decoding or detection."""
    done = asyncio.Event()
    read = 0

    async def on_message(msg: Msg) -> None:
        nonlocal read
        read += 1
        if read % 500 == 0 or read >= count:
            await msg.ack()
        if read >= count:
            done.set()

    start = time.process_time()
    sub = await bus.js.subscribe(
        bus.subjects.all("raw"),
        durable="bare",
        stream=bus.subjects.stream("raw"),
        cb=on_message,
        manual_ack=True,
        pending_msgs_limit=50_000,
        config=ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=20_000),
    )
    await asyncio.wait_for(done.wait(), 120)
    rate = read / (time.process_time() - start)
    await sub.unsubscribe()
    return rate


async def main(jobs: int, ranks: int, total: int, rate: float) -> int:
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats") as server:
        settings = Settings(nats_url=server.url, namespace=NAMESPACE)
        bus = await Bus.connect(settings, "bench")
        await bus.ensure_streams()
        names = await seed_jobs(bus, jobs, ranks)
        port = free_port()
        env = {
            **os.environ,
            "RESURGE_NATS_URL": server.url,
            "RESURGE_NAMESPACE": NAMESPACE,
            "RESURGE_METRICS_PORT": str(port),
            "RESURGE_LOG_LEVEL": "INFO",
            "RESURGE_LOG_FORMAT": "text",
        }
        detector_log = (Path(tmp) / "detector.log").open("wb")
        detector = subprocess.Popen(  # noqa: ASYNC220 (started once, before the timed part)
            [sys.executable, "-m", "resurge_detector"],
            env=env,
            stdout=detector_log,
            stderr=subprocess.STDOUT,
        )
        try:
            faults: list[FaultDetected] = []
            silent = {(name, 3) for name in names[: max(1, jobs // 5)]}
            all_hangs_seen = asyncio.Event()

            async def on_fault(event: Event, subject: str) -> None:
                if isinstance(event, FaultDetected):
                    faults.append(event)
                    seen = {(f.job, f.rank) for f in faults if f.reason == "hang"}
                    if silent <= seen:
                        all_hangs_seen.set()

            await bus.subscribe(bus.subjects.all("fault"), on_fault)
            while True:  # the detector is up once its consumer exists
                try:
                    await bus.js.consumer_info(bus.subjects.stream("raw"), "detector")
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # its job watch has loaded the records
            last: dict[tuple[str, int], float] = {}
            cpu_before = cpu_seconds(detector.pid)
            started = time.monotonic()
            sent = await generate(bus, names, ranks, total, silent, last, rate)
            published_in = time.monotonic() - started
            watcher = await Bus.connect(settings, "bench-watch")
            info = await watcher.js.consumer_info(bus.subjects.stream("raw"), "detector")
            while info.num_pending or info.num_ack_pending:
                await asyncio.sleep(0.05)  # another process's progress: polled
                info = await watcher.js.consumer_info(bus.subjects.stream("raw"), "detector")
            consumed_in = time.monotonic() - started
            cpu = cpu_seconds(detector.pid) - cpu_before
            stream = await bus.js.stream_info(bus.subjects.stream("raw"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_hangs_seen.wait(), HEARTBEAT_TIMEOUT + 5)
            hangs = {(f.job, f.rank): f for f in faults if f.reason == "hang"}
            latencies = sorted(
                hangs[key].time.timestamp() - last[key] for key in silent if key in hangs
            )
            stray = [f for f in faults if (f.job, f.rank) not in silent]
            baseline = await bare_read_rate(bus, sent)
        finally:
            detector.terminate()
            try:
                detector.wait(timeout=20)
            except subprocess.TimeoutExpired:
                print("detector did not stop on SIGTERM within 20 s; killed")
                detector.kill()
            await bus.close()
            log_tail = (Path(tmp) / "detector.log").read_text()[-2000:]
    if "Traceback" in log_tail or "error" in log_tail:
        print("detector log (end):", log_tail)
    per_core = sent / cpu if cpu else float("nan")
    print(
        f"jobs {jobs} x ranks {ranks}; events published {sent} in {published_in:.1f} s "
        f"(asked rate {rate or 'unlimited'}/s), "
        f"all consumed after {consumed_in:.1f} s"
    )
    print(
        f"stream holds {stream.state.messages} messages; consumer pending "
        f"{info.num_pending}, ack pending {info.num_ack_pending} -> drops: "
        f"{sent - stream.state.messages + info.num_pending}"
    )
    print(
        f"detector: {cpu:.2f} CPU s -> {per_core:,.0f} events/s per core "
        f"(bare batch read without detection: {baseline:,.0f}/s per core, "
        f"ratio {per_core / baseline:.2f})"
    )
    if latencies:
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(
            f"hangs: {len(hangs)} of {len(silent)} silent ranks detected; latency after the "
            f"last progress p50 {p50:.3f} s, p99 {p99:.3f} s "
            f"(timeout {HEARTBEAT_TIMEOUT} s, goal p99 <= {HEARTBEAT_TIMEOUT + 0.5} s)"
        )
    print(f"faults not about a silent rank: {len(stray)}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument(
        "--rate",
        type=float,
        default=0,
        help="events per second to publish (0: as fast as possible)",
    )
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.jobs, args.ranks, args.events, args.rate)))
