"""Curve 2: hang detection under telemetry load, at one size.

As bench/detector_throughput.py measures it, at the load of a job of ``replicas``
ranks: a running job of that many ranks (one per replica, ``per_node`` to a node,
heartbeat timeout :data:`HEARTBEAT_TIMEOUT`) is seeded in the jobs bucket; a real
detector runs; bench/scale_load.py publishes one Progress per rank per second, and per
node one GPU sample and one node report per second, through the agents' path. A
generation gets one hang fault (the detector blames one rank for a hang), so each
round is a new generation, as after a restart: the record and the load move to it,
every rank reports in it for the timeout and 2 s more, then one rank (a different one
each round) goes silent and the bench waits for the detector's hang fault about it.
A sample is the fault's time less the rank's last progress (the moment the timeout
counts from) less the timeout: what detection adds past the timeout, the part that
grows with load. Every rank reports one step a second, so the silent one falls behind
and is the one to blame; a hang fault of the round's generation that blames another
rank still counts as the detection, and is counted. A hang fault before the round's
rank goes silent (a live rank taken for hung: the generation's one hang fault is spent)
and other faults (a detector so far behind that live ranks or nodes look silent) are
counted, and so are the detector's backlog and the load's lag behind its schedule at
the end. A silent rank not detected
within a minute ends the point: the rounds after it would miss too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from scale_agents import node_of
from scale_fleet import start_service, stop_all, until_consumer
from scale_load import GENERATION, SILENCE, STATUS
from scale_nats import Nats

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import Event, FaultDetected, JobPhase
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus

__all__ = ["HEARTBEAT_TIMEOUT", "Detection", "measure_detection"]

JOB = "det"
HEARTBEAT_TIMEOUT = 2.0
LOAD = Path(__file__).resolve().parent / "scale_load.py"


@dataclass
class Detection:
    """Seconds past the timeout, per silenced rank; what else was seen."""

    past_timeout: list[float]
    missed: int
    early: int
    stray: int
    blamed_another: int
    backlog: int
    load_behind: float

    def note(self) -> str:
        words = [f"timeout {HEARTBEAT_TIMEOUT:g} s"]
        if self.missed:
            words.append(f"a silent rank not detected within {HEARTBEAT_TIMEOUT + 60:g} s")
        if self.early:
            words.append(
                f"{self.early} hang faults before the silence (a live rank taken for hung)"
            )
        if self.blamed_another:
            words.append(f"{self.blamed_another} hang faults blamed a live rank")
        if self.stray:
            words.append(f"{self.stray} other faults (live ranks or nodes taken for lost)")
        if self.backlog:
            words.append(f"detector {self.backlog} messages behind at the end")
        if self.load_behind > 1:
            words.append(f"load {self.load_behind:.1f} s behind its schedule")
        return "; ".join(words)


async def seed(bus: Bus, replicas: int, per_node: int) -> None:
    spec = job(
        JOB,
        nproc=1,
        replicas=replicas,
        monitoring={"heartbeatTimeoutSeconds": HEARTBEAT_TIMEOUT},
        preload=None,
    )
    placements = [Placement(replica=r, node=node_of(r, per_node)) for r in range(replicas)]
    record = JobRecord(name=JOB, spec=spec, phase=JobPhase.RUNNING, placements=placements)
    await JobStore(await bus.jobs_bucket()).create(record)


def _to_generation(record: JobRecord, generation: int) -> bool:
    record.generation = generation
    return True


async def measure_detection(
    nats: Nats, namespace: str, replicas: int, rounds: int, per_node: int, folder: Path
) -> Detection:
    bus = await Bus.connect(nats.settings(namespace), "bench")
    log = (folder / f"detection-{namespace}.log").open("wb")
    children: list[subprocess.Popen[bytes]] = []
    try:
        await bus.ensure_streams()
        await seed(bus, replicas, per_node)
        hangs: dict[int, FaultDetected] = {}  # generation -> its hang fault
        silenced: dict[int, int] = {}  # generation -> the rank silenced in it
        seen: defaultdict[int, asyncio.Event] = defaultdict(asyncio.Event)
        stray = early = 0
        blamed_another: list[int] = []  # generations whose hang fault named a live rank

        async def on_fault(event: Event, _subject: str) -> None:
            nonlocal stray, early
            if not isinstance(event, FaultDetected) or event.generation is None:
                return
            if event.reason == "hang" and event.generation in silenced:
                hangs.setdefault(event.generation, event)
                seen[event.generation].set()
                if event.rank != silenced[event.generation]:
                    blamed_another.append(event.generation)
            elif event.reason == "hang":
                early += 1
            else:
                stray += 1

        await bus.subscribe(bus.subjects.all("fault"), on_fault)
        children.append(start_service("resurge_detector", nats, namespace, log))
        await until_consumer(bus, "raw", "detector")
        load = subprocess.Popen(  # noqa: ASYNC220 (started before the timed part)
            [
                *(sys.executable, str(LOAD), nats.url, namespace, str(nats.stream_replicas)),
                *(JOB, str(replicas), str(per_node)),
            ],
            env=nats.env(namespace),
            stdout=subprocess.PIPE,
            stderr=log,
        )
        children.append(load)
        assert load.stdout is not None
        await asyncio.to_thread(load.stdout.readline)  # "publishing"
        store = JobStore(await bus.jobs_bucket())
        chosen = random.Random(replicas).sample(range(replicas), min(replicas, rounds))
        past: list[float] = []
        missed = 0
        for generation, rank in enumerate(chosen, start=1):
            # A generation has one hang fault: each round is a restart's new generation.
            await store.mutate(JOB, partial(_to_generation, generation=generation))
            await bus.nc.request(GENERATION, str(generation).encode(), timeout=30)
            # Every rank reports in the new generation, and is judged, before one goes silent.
            await asyncio.sleep(HEARTBEAT_TIMEOUT + 2)
            silenced[generation] = rank
            answer = await bus.nc.request(SILENCE, json.dumps([rank]).encode(), timeout=30)
            last = json.loads(answer.data)[str(rank)]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(seen[generation].wait(), HEARTBEAT_TIMEOUT + 60)
            fault = hangs.get(generation)
            if fault is None or not last:
                missed += 1
                break  # a detector that missed one within a minute misses the next too
            past.append(fault.time.timestamp() - last - HEARTBEAT_TIMEOUT)
        status = json.loads((await bus.nc.request(STATUS, b"", timeout=30)).data)
        info = await bus.js.consumer_info(bus.subjects.stream("raw"), "detector")
        return Detection(
            past,
            missed,
            early,
            stray,
            len(blamed_another),
            info.num_pending + info.num_ack_pending,
            status["behind_seconds"],
        )
    finally:
        stop_all(children)
        await bus.close()
        log.close()
