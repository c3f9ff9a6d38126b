"""Curve 3: a real scaler's grow decision -> the first step at the new size, at one size.

A running elastic job of ``replicas - per_node`` replicas (``min`` that, ``max``
``replicas``; one worker each, ``per_node`` to a node) is seeded with its worker
groups in the local backend, on ``replicas / per_node`` nodes whose records the bench
writes and keeps alive as their monitors would; the last node is free. A real scaler
and a real restarter run; the agents are simulated (bench/scale_agents.py with
``--respond``): they say ``waiting`` when their worker group is written, answer
CheckpointNow with CheckpointSaved, and send the new generation's first Progress as
soon as they hold its Assign. So what is timed is the control plane alone, with no
worker start and no rendezvous: the scaler deciding to grow into the free node
(its first new worker group seen in the bucket), the warm-up (the added agents
waiting), the checkpoint every rank saves first (CheckpointNow to every replica, each
report counted into the job record by the restarter), the resize written (ScaleDecided),
the restarter's Stops and Assigns to every replica, until the last replica has sent its
first step of the new generation (a step at the new size needs every rank).

Between rounds the free node is taken away as ``resurge node remove`` does (cordoned as
being removed: the scaler shrinks the job off it at once), then given back (uncordoned:
the scaler waits its settle time for capacity still arriving, then grows again).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from nats.aio.msg import Msg
from nats.js.kv import KeyValue
from scale_agents import node_of
from scale_fleet import Fleet, last_error, start_service, stop_all, until_consumer
from scale_nats import Nats

from resurge.cluster import NodeInfo, open_backend
from resurge.cluster.local.keys import WORKER_GROUPS_BUCKET, parse_worker_group_key
from resurge.control.decisions.worker_groups import worker_group
from resurge.control.effects.nodes import REMOVING_REASON
from resurge.control.state.records import JobRecord, JobStore, Placement
from resurge.events import Event, JobPhase, PhaseChanged, ScaleDecided
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus

__all__ = ["Resize", "measure_resize"]

JOB = "grow"
HEARTBEAT_SECONDS = 5.0  # node records rewritten this often (they live 15 s)
ROUND_SECONDS = 150.0  # a grow or a shrink that takes longer is reported as not done


@dataclass
class Resize:
    """Per grow, seconds from the decision to: the last added agent saying it waits
    (the warm-up), the last rank's CheckpointSaved sent (CheckpointNow to every
    replica, answered), the scaler's ScaleDecided (the restarter counted every report
    into the job record; the scaler wrote the resize), the last replica holding its
    Assign, the last replica's first step at the new size."""

    warm: list[float] = field(default_factory=list)
    saved: list[float] = field(default_factory=list)
    decided: list[float] = field(default_factory=list)
    assigned: list[float] = field(default_factory=list)
    stepped: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def note(self) -> str:
        def median(values: list[float]) -> str:
            return f"{statistics.median(values):.2f}" if values else "none"

        stages = (
            f"medians from the decision (s): warm-up {median(self.warm)}, "
            f"last checkpoint sent {median(self.saved)}, ScaleDecided {median(self.decided)}, "
            f"last Assign held {median(self.assigned)}, last first step {median(self.stepped)}"
        )
        return "; ".join([stages, *self.failures])


async def seed(bus: Bus, replicas: int, per_node: int) -> None:
    """The job at ``replicas - per_node`` replicas, its worker groups, every node."""
    backend = await open_backend(bus, bus.settings)
    spec = job(
        JOB,
        nproc=1,
        replicas={"min": replicas - per_node, "max": replicas},
        elastic={"cooldownSeconds": 0, "scaleUpSnoozeSeconds": 0},
        preload=None,
    )
    placed = replicas - per_node
    placements = [Placement(replica=r, node=node_of(r, per_node)) for r in range(placed)]
    record = JobRecord(
        name=JOB,
        spec=spec,
        phase=JobPhase.RUNNING,
        placements=placements,
        reports_progress=True,  # a grow asks for a checkpoint first, as of a real job
    )
    await JobStore(await bus.jobs_bucket()).create(record)
    for placement in placements:
        await backend.create_worker_group(worker_group(record, placement))
    await report_nodes(bus, replicas, per_node)


async def report_nodes(bus: Bus, replicas: int, per_node: int) -> None:
    backend = await open_backend(bus, bus.settings)
    for index in range(replicas // per_node):
        info = NodeInfo(
            name=f"node-{index}",
            slots=per_node,
            heartbeat=datetime.now(UTC),
            gpu_monitoring="simulated",
        )
        await backend.report_node(info)


async def keep_nodes_alive(bus: Bus, replicas: int, per_node: int) -> None:
    while True:
        await asyncio.sleep(HEARTBEAT_SECONDS)
        await report_nodes(bus, replicas, per_node)


async def measure_resize(
    nats: Nats,
    namespace: str,
    replicas: int,
    rounds: int,
    per_node: int,
    processes: int,
    folder: Path,
) -> Resize:
    bus = await Bus.connect(nats.settings(namespace), "bench")
    log_path = folder / f"resize-{namespace}.log"
    log = log_path.open("wb")
    fleet = Fleet(bus)
    services = []
    tasks: list[asyncio.Task[None]] = []
    out = Resize()
    try:
        await bus.ensure_streams()
        await seed(bus, replicas, per_node)
        backend = await open_backend(bus, bus.settings)
        spare = node_of(replicas - 1, per_node)
        await fleet.listen()
        decided: dict[int, ScaleDecided] = {}  # to_generation -> the decision
        running: set[int] = set()  # generations whose resize ended (Running again)
        grown_at: list[float] = []  # each grow's first new worker group seen, epoch s

        async def on_action(event: Event, _subject: str) -> None:
            if isinstance(event, ScaleDecided):
                decided[event.to_generation] = event
            elif (
                isinstance(event, PhaseChanged)
                and event.phase is JobPhase.RUNNING
                and event.generation is not None
            ):
                running.add(event.generation)
            fleet.poke()

        await bus.subscribe(bus.subjects.action(JOB), on_action)
        heard: dict[str, list[float]] = {"agent_state": [], "checkpoint_saved": []}
        for kind, times in heard.items():

            async def note(_msg: Msg, times: list[float] = times) -> None:
                times.append(time.time())

            await bus.nc.subscribe(bus.subjects.raw(JOB, kind, None), cb=note)

        def last_between(times: list[float], first: float, last: float) -> float:
            return max((t for t in times if first <= t <= last), default=first)

        groups = await (await bus.create_bucket(WORKER_GROUPS_BUCKET)).watchall()
        tasks.append(asyncio.create_task(_first_groups(groups, spare, grown_at, fleet)))
        # A grow adds replicas of new numbers (the next after the highest yet), each
        # grow per_node more: agents for them all, on the free node.
        agents = replicas + (rounds - 1) * per_node
        placed = replicas - per_node
        await fleet.start(nats, namespace, JOB, agents, per_node, processes, log, True, placed)
        tasks.append(asyncio.create_task(keep_nodes_alive(bus, replicas, per_node)))
        services.append(start_service("resurge_restarter", nats, namespace, log))
        await until_consumer(bus, "fault", "restarter")
        services.append(start_service("resurge_scaler", nats, namespace, log))

        def grown(grows: int) -> bool:
            """The grow after ``grows`` earlier ones ended: every replica stepped."""
            if len(grown_at) <= grows or not decided:
                return False
            last = max(decided)
            return (
                decided[last].resize == "grow"
                and last in running
                and len(fleet.stepped.get(last, {})) == replicas
            )

        def shrunk(after: int) -> bool:
            """The shrink after generation ``after`` ended: every replica left stepped."""
            last = max(decided)
            return (
                last > after
                and last in running
                and len(fleet.stepped.get(last, {})) == replicas - per_node
            )

        for round_ in range(rounds):
            try:
                grows = len(grown_at)
                await fleet.until(partial(grown, grows), ROUND_SECONDS, f"grow {round_ + 1}")
                new = max(decided)
                began = grown_at[grows]
                at = decided[new].time.timestamp()
                out.warm.append(last_between(heard["agent_state"], began, at) - began)
                out.saved.append(last_between(heard["checkpoint_saved"], began, at) - began)
                out.decided.append(at - began)
                out.assigned.append(max(fleet.held[new].values()) - began)
                out.stepped.append(max(fleet.stepped[new].values()) - began)
                if round_ == rounds - 1:
                    break
                await backend.cordon(spare, reason=REMOVING_REASON)
                await fleet.until(partial(shrunk, new), ROUND_SECONDS, f"shrink {round_ + 1}")
                await backend.uncordon(spare)
            except TimeoutError as error:
                log.flush()
                logged = last_error(log_path)
                out.failures.append(f"round {round_ + 1}: {error}; last error logged: {logged}")
                break
        return out
    finally:
        for task in tasks:
            task.cancel()
        fleet.stop()
        stop_all(services)
        await bus.close()
        log.close()


async def _first_groups(
    watcher: KeyValue.KeyWatcher, spare: str, grown_at: list[float], fleet: Fleet
) -> None:
    """Note when each grow's first worker group on ``spare`` is written (its
    decision): the first put on that node after a time with none there."""
    there: set[int] = set()
    async for entry in watcher:
        if entry is None:
            continue
        node, _job, replica = parse_worker_group_key(entry.key)
        if node != spare:
            continue
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            there.discard(replica)
            continue
        if not there:
            grown_at.append(time.time())
            fleet.poke()
        there.add(replica)
