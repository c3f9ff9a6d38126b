"""Curve 1: one process fault -> the last replica holds its new Assign, at one size.

As bench/fanout.py measures it at one size: a running job of ``replicas`` replicas (one
worker each, ``per_node`` to a node) is seeded in the jobs bucket; simulated agents
(bench/scale_agents.py, many to a process) take their commands through a command inbox
each; a real restarter runs. Each round publishes a process fault about the last
replica and times, from the publish, until every replica holds the new generation's
Assign; the new generation's rendezvous, passed (what ends the recovery of a job whose
workers report no progress), then closes the recovery (the restarter's
RecoveryFinished), and the next round begins.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

from scale_agents import node_of
from scale_fleet import Fleet, last_error, start_service, stop_all, until_consumer
from scale_nats import Nats

from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import (
    Event,
    FaultDetected,
    FaultScope,
    JobPhase,
    RecoveryFinished,
    RendezvousPassed,
)
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus

__all__ = ["measure_fanout"]

JOB = "fan"
ASSIGN_SECONDS = 60.0  # a fan-out not done by then is reported as failed (4,096: ~1 s)


async def seed(bus: Bus, replicas: int, per_node: int) -> None:
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
    placements = [Placement(replica=r, node=node_of(r, per_node)) for r in range(replicas)]
    record = JobRecord(name=JOB, spec=spec, phase=JobPhase.RUNNING, placements=placements)
    await JobStore(await bus.jobs_bucket()).create(record)


async def measure_fanout(
    nats: Nats,
    namespace: str,
    replicas: int,
    rounds: int,
    per_node: int,
    processes: int,
    folder: Path,
) -> list[float]:
    """Seconds from each round's fault to the last replica holding its new Assign."""
    bus = await Bus.connect(nats.settings(namespace), "bench")
    log_path = folder / f"fanout-{namespace}.log"
    log = log_path.open("wb")
    fleet = Fleet(bus)
    restarter = None
    try:
        await bus.ensure_streams()
        await seed(bus, replicas, per_node)
        await fleet.listen()
        finished: set[int] = set()

        async def on_action(event: Event, _subject: str) -> None:
            if isinstance(event, RecoveryFinished) and event.generation is not None:
                finished.add(event.generation)
                fleet.poke()

        await bus.subscribe(bus.subjects.action(JOB), on_action)
        await fleet.start(nats, namespace, JOB, replicas, per_node, processes, log, False)
        restarter = start_service("resurge_restarter", nats, namespace, log)
        await until_consumer(bus, "fault", "restarter")
        last = replicas - 1

        def everyone(generation: int) -> bool:
            return len(fleet.held.get(generation, {})) == replicas

        def closed(generation: int) -> bool:
            return generation in finished

        to_last: list[float] = []
        for generation in range(rounds):
            fault = FaultDetected(
                source=bus.source,
                job=JOB,
                fault_id=f"bench-{generation}",
                scope=FaultScope.PROCESS,
                reason="process_crash",
                generation=generation,
                replica=last,
                node=node_of(last, per_node),
            )
            sent = time.time()
            await bus.publish(bus.subjects.fault(JOB, "process"), fault)
            new = generation + 1
            try:
                await fleet.until(partial(everyone, new), ASSIGN_SECONDS, "every Assign")
            except TimeoutError as error:
                log.flush()
                raise TimeoutError(f"{error}; last error logged: {last_error(log_path)}") from None
            to_last.append(max(fleet.held[new].values()) - sent)
            passed = RendezvousPassed(
                source=bus.source,
                job=JOB,
                replica=0,
                node=node_of(0, per_node),
                generation=new,
                world_size=replicas,
            )
            await bus.publish(bus.subjects.raw(JOB, passed.kind, node_of(0, per_node)), passed)
            await fleet.until(partial(closed, new), 120, "the recovery to close")
        return to_last
    finally:
        fleet.stop()
        if restarter is not None:
            stop_all([restarter])
        await bus.close()
        log.close()
