"""Run one job on a local cluster and record every control-plane event it causes.

Used by ``resurge demo``, the end-to-end tests and the benchmarks, so all three tell the
same story: a :class:`~resurge.local.supervisor.Supervisor` (services and virtual nodes
as processes; it holds the state folder as ``resurge up`` does, so the ``resurge`` CLI
pointed at that folder reaches it), a job submitted over the bus, and every event but
log lines captured with its subject until the job ends. ``during`` runs beside the job
(to break it on purpose); it can await what happened so far through
:meth:`Watch.wait_for`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from resurge.control.effects.client import submit_job
from resurge.control.views.history import read_history
from resurge.events import (
    AgentState,
    AgentStateChanged,
    Assign,
    Envelope,
    Event,
    FaultDetected,
    JobPhase,
    PhaseChanged,
    RecoveryFinished,
)
from resurge.jobspec import TrainingJob
from resurge.local.state import ClusterState, StateLock
from resurge.local.supervisor import Supervisor
from resurge.runtime.bus import Bus

__all__ = ["Observed", "StoryResult", "Watch", "run_job"]

_WATCHED_RAW_KINDS = (
    "process_started",
    "process_exited",
    "process_state",
    "rendezvous_passed",
    "progress",
    "checkpoint_saved",
    "restored",
    "agent_state",
)

E = TypeVar("E", bound=Envelope)


@dataclass(frozen=True)
class Observed:
    """One event as the story saw it: the subject it came on and when it arrived."""

    subject: str
    event: Event
    received: float = field(default_factory=time.time)


class Watch:
    """Events observed so far, and a way to wait for a condition over them; ``supervisor``
    is the cluster, so a story can break its services too.

    Each event is recorded once: the watch listens on core NATS, which passes on every
    publish, including a publisher's retry of a message (same id) that JetStream stores
    only once, as after a timed-out acknowledgement while a stream's leader changes.
    """

    def __init__(self, supervisor: Supervisor | None = None) -> None:
        self.observed: list[Observed] = []
        self.supervisor = supervisor
        self._changed = asyncio.Condition()
        self._ids: set[str] = set()

    async def add(self, item: Observed) -> None:
        """Record ``item`` (unless an event with its id was recorded) and wake whoever
        waits in :meth:`wait_for`."""
        async with self._changed:
            if item.event.id in self._ids:
                return
            self._ids.add(item.event.id)
            self.observed.append(item)
            self._changed.notify_all()

    async def wait_for(
        self, test: Callable[[list[Observed]], bool], wait_seconds: float = 60
    ) -> None:
        """Return once ``test`` holds for the events observed so far; raise
        :class:`TimeoutError` if it does not within ``wait_seconds``."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: test(self.observed)), wait_seconds
            )


@dataclass
class StoryResult:
    """What one run of a job told: its final phase (None if it never finished), every
    event observed, and how the local cluster's services fared."""

    job: str
    phase: JobPhase | None
    observed: list[Observed]
    services_alive: dict[str, bool]
    service_restarts: dict[str, int]
    seconds: float

    def events(self, kind: type[E]) -> list[E]:
        """The observed events of type ``kind``, in the order they arrived."""
        return [o.event for o in self.observed if isinstance(o.event, kind)]

    @property
    def faults(self) -> list[FaultDetected]:
        """Every FaultDetected, in the order it arrived."""
        return self.events(FaultDetected)

    @property
    def recoveries(self) -> list[RecoveryFinished]:
        """Every RecoveryFinished, in the order it arrived."""
        return self.events(RecoveryFinished)

    def final_agent_states(self) -> dict[int, AgentState]:
        """Replica -> the state its launch agent last reported."""
        return _last_agent_states(self.observed)

    def restart_latencies(self) -> list[float]:
        """Seconds from each fault's worker exit to the first Assign of the next generation."""
        return self.latencies_after_exit(Assign)

    def latencies_after_exit(self, kind: type[Envelope]) -> list[float]:
        """Seconds from each fault's worker exit to the first ``kind`` event of the next
        generation (Assign: the restart command; Progress: its first completed step)."""
        latencies = []
        for fault in self.faults:
            exited_at = fault.evidence.get("exited_at")
            if not isinstance(exited_at, str) or fault.generation is None:
                continue
            after = [
                o.event.time
                for o in self.observed
                if isinstance(o.event, kind) and o.event.generation == fault.generation + 1
            ]
            if after:
                exited = datetime.fromisoformat(exited_at)
                latencies.append((min(after) - exited).total_seconds())
        return latencies


async def run_job(
    job: TrainingJob,
    *,
    state_dir: Path,
    namespace: str,
    nats_url: str | None = None,
    nodes: int = 2,
    gpus_per_node: int = 2,
    wait_seconds: float = 120.0,
    on_event: Callable[[Observed], None] | None = None,
    before_submit: Callable[[Bus], Awaitable[None]] | None = None,
    during: Callable[[Bus, Watch], Coroutine[Any, Any, None]] | None = None,
    cwd: Path | None = None,
    restarters: int = 1,
    end_with_during: bool = False,
    nats_servers: int = 1,
) -> StoryResult:
    """Start a local cluster (on ``nats_url``, or an embedded server), run ``job`` to its end.

    As under ``resurge up``, a service that dies is started again (with backoff).
    ``end_with_during``: the story also ends when ``during`` returns (for a job that
    ``during`` deletes or never lets finish).
    """
    supervisor = Supervisor(
        state_dir,
        nodes,
        gpus_per_node,
        namespace=namespace,
        nats_url=nats_url,
        extra_env={"RESURGE_LOG_LEVEL": "INFO"},
        restarters=restarters,
        nats_servers=nats_servers,
    )
    if cwd is not None:
        supervisor.cwd = cwd
    watch = Watch(supervisor)
    recorder = _Recorder(watch, job.name, on_event)
    started = time.monotonic()
    lock = StateLock(state_dir)
    if not lock.acquire():
        raise RuntimeError(f"another local cluster runs in {state_dir}")
    try:
        await asyncio.to_thread(supervisor.start)
    except BaseException:
        lock.release()
        raise
    supervisor.state().save(state_dir)  # `resurge --state-dir STATE_DIR ...` finds it
    try:
        assert supervisor.nats_url is not None
        bus = await Bus.connect(supervisor.settings("admin"), "story")
        try:
            await _subscribe(bus, job.name, recorder)
            if before_submit is not None:
                await before_submit(bus)
            await submit_job(bus, job)
            await _until_finished(
                supervisor,
                recorder,
                wait_seconds,
                during(bus, watch) if during else None,
                end_with_during=end_with_during,
            )
            if recorder.done.is_set():
                with contextlib.suppress(TimeoutError):
                    await watch.wait_for(lambda seen: _all_exited(seen, job.name), 20)
            await _backfill(bus, job.name, watch)
            alive = supervisor.alive()
        finally:
            await bus.close()
    finally:
        await asyncio.to_thread(supervisor.stop)
        ClusterState.path(state_dir).unlink(missing_ok=True)
        lock.release()
    return StoryResult(
        job=job.name,
        phase=recorder.phase,
        observed=watch.observed,
        services_alive=alive,
        service_restarts={name: child.restarts for name, child in supervisor.children.items()},
        seconds=time.monotonic() - started,
    )


class _Recorder:
    """Adds each event to the watch (and hands it to ``on_event``); notices the job's
    first finished phase."""

    def __init__(self, watch: Watch, job: str, on_event: Callable[[Observed], None] | None):
        self.watch = watch
        self.job = job
        self.on_event = on_event
        self.phase: JobPhase | None = None
        self.done = asyncio.Event()

    async def __call__(self, event: Event, subject: str) -> None:
        item = Observed(subject=subject, event=event)
        await self.watch.add(item)
        if self.on_event:
            self.on_event(item)
        if isinstance(event, PhaseChanged) and event.job == self.job and event.phase.finished:
            if self.phase is None:
                self.phase = event.phase
            self.done.set()


async def _backfill(bus: Bus, job: str, watch: Watch) -> None:
    """Add what the durable streams hold of ``job``'s faults, actions and life that the
    live subscriptions did not deliver. Under load a nats-server now and then delivered
    nothing to a core subscription made after its publisher had connected (seen by a
    ">" watcher on a third connection; cf. nats-io/nats-server#2150): a story then
    missed a recovery the job went through."""
    stored = await read_history(bus, job=job, families=("fault", "action", "job"))
    for item in stored.events:  # the watch keeps one of each event id
        await watch.add(Observed(subject=item.subject, event=item.event))


async def _subscribe(bus: Bus, job: str, recorder: _Recorder) -> None:
    """Every control-plane family and the job's raw events but log lines, all flushed."""
    for family in ("fault", "cmd", "action", "job", "dlq"):
        await bus.subscribe(bus.subjects.all(family), recorder)
    for kind in _WATCHED_RAW_KINDS:
        await bus.subscribe(bus.subjects.raw(job, kind, None), recorder)
    await bus.nc.flush()


async def _until_finished(
    supervisor: Supervisor,
    recorder: _Recorder,
    wait_seconds: float,
    during: Coroutine[Any, Any, None] | None,
    *,
    end_with_during: bool = False,
) -> None:
    """Keep the services alive and run ``during`` until the job finishes (or ``during``
    returns, with ``end_with_during``) or ``wait_seconds`` pass; then stop both."""
    keeper = asyncio.create_task(_keep_alive(supervisor))
    side = asyncio.create_task(during) if during is not None else None
    ends: set[asyncio.Future[Any]] = {asyncio.ensure_future(recorder.done.wait())}
    if side is not None and end_with_during:
        ends.add(side)
    done, _ = await asyncio.wait(ends, timeout=wait_seconds, return_when=asyncio.FIRST_COMPLETED)
    for end in ends - {side}:
        end.cancel()
    failed = side.exception() if side is not None and side in done else None
    for task in (side, keeper):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if failed is not None:
        raise failed


async def _keep_alive(supervisor: Supervisor) -> None:
    while True:
        checking = asyncio.ensure_future(asyncio.to_thread(supervisor.check))  # it blocks
        try:
            await asyncio.shield(checking)
        except asyncio.CancelledError:  # the check's thread ends before anything is stopped
            await checking
            raise
        await asyncio.sleep(0.2)


def _last_agent_states(observed: list[Observed]) -> dict[int, AgentState]:
    last: dict[int, AgentState] = {}
    for o in observed:
        if isinstance(o.event, AgentStateChanged) and o.event.replica is not None:
            last[o.event.replica] = o.event.state
    return last


def _all_exited(observed: list[Observed], job: str) -> bool:
    """Every replica of ``job``'s last assigned generation said it exits. A replica a
    shrink took away, or one lost with its node, may never say so (its agent was removed
    while the job ran, or died with its node), so only the last generation's replicas
    are waited for."""
    assigned = [o.event for o in observed if isinstance(o.event, Assign) and o.event.job == job]
    if not assigned:
        return False
    last = max(a.generation for a in assigned)
    final = {a.replica for a in assigned if a.generation == last and a.replica is not None}
    said = _last_agent_states(observed)
    return all(said.get(replica) is AgentState.EXITING for replica in final)
