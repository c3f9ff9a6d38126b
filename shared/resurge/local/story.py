"""Run one job on a local cluster and record every control-plane event it causes.

Used by ``resurge demo``, the end-to-end tests and the benchmarks, so all three tell the
same story: services and agents as processes, a job submitted over the bus, and every
fault, command, action and job event captured with its subject and arrival time until
the job ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from resurge.bus import Bus
from resurge.client import submit_job
from resurge.events import Assign, Event, FaultDetected, JobPhase, PhaseChanged, RecoveryFinished
from resurge.jobspec import TrainingJob
from resurge.local.cluster import LocalCluster
from resurge.settings import Settings

__all__ = ["Observed", "StoryResult", "run_job"]


@dataclass(frozen=True)
class Observed:
    subject: str
    event: Event
    received: float = field(default_factory=time.time)


@dataclass
class StoryResult:
    job: str
    phase: JobPhase | None
    observed: list[Observed]
    agent_exit_codes: dict[str, int | None]
    services_alive: dict[str, bool]
    seconds: float

    @property
    def faults(self) -> list[FaultDetected]:
        return [o.event for o in self.observed if isinstance(o.event, FaultDetected)]

    @property
    def recoveries(self) -> list[RecoveryFinished]:
        return [o.event for o in self.observed if isinstance(o.event, RecoveryFinished)]

    def restart_latencies(self) -> list[float]:
        """Seconds from each fault's worker exit to the first Assign of the next generation."""
        latencies = []
        for fault in self.faults:
            exited_at = fault.evidence.get("exited_at")
            if not isinstance(exited_at, str) or fault.generation is None:
                continue
            assigns = [
                o.event
                for o in self.observed
                if isinstance(o.event, Assign) and o.event.generation == fault.generation + 1
            ]
            if assigns:
                start = fault.time.fromisoformat(exited_at)
                latencies.append((min(a.time for a in assigns) - start).total_seconds())
        return latencies


async def run_job(
    job: TrainingJob,
    *,
    state_dir: Path,
    nats_url: str,
    namespace: str,
    nodes: list[str],
    wait_seconds: float = 120.0,
    on_event: Callable[[Observed], None] | None = None,
    before_submit: Callable[[Bus], Awaitable[None]] | None = None,
    cwd: Path | None = None,
) -> StoryResult:
    """Start services and one agent per replica, submit ``job``, wait for it to end."""
    cluster = LocalCluster(state_dir, nats_url, namespace, nodes, cwd=cwd)
    settings = Settings(nats_url=nats_url, namespace=namespace, log_level="WARNING")
    observed: list[Observed] = []
    done = asyncio.Event()
    final_phase: list[JobPhase] = []
    started = time.monotonic()
    bus = await Bus.connect(settings, "story")
    try:
        await bus.ensure_streams()

        async def record(event: Event, subject: str) -> None:
            item = Observed(subject=subject, event=event)
            observed.append(item)
            if on_event:
                on_event(item)
            if isinstance(event, PhaseChanged) and event.job == job.name and event.phase.finished:
                final_phase.append(event.phase)
                done.set()

        for family in ("fault", "cmd", "action", "job", "dlq"):
            await bus.subscribe(bus.subjects.all(family), record)
        await bus.nc.flush()
        cluster.start_services()
        for replica in range(job.spec.replicas.min):
            cluster.start_agent(
                job.name,
                replica,
                job.spec.nproc_per_node,
                job.spec.command,
                stop_grace_seconds=job.spec.recovery.stop_grace_seconds,
                working_dir=job.spec.working_dir,
                env={var.name: var.value for var in job.spec.env},
            )
        if before_submit is not None:
            await before_submit(bus)
        await submit_job(bus, job)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), wait_seconds)
        codes = await asyncio.to_thread(cluster.wait_agents, 15.0)
        alive = {name: up for name, up in cluster.alive().items() if not name.startswith("agent-")}
    finally:
        await bus.close()
        await asyncio.to_thread(cluster.stop)
    return StoryResult(
        job=job.name,
        phase=final_phase[0] if final_phase else None,
        observed=observed,
        agent_exit_codes=codes,
        services_alive=alive,
        seconds=time.monotonic() - started,
    )
