"""resurge survives an outage of its own NATS server.

On a local cluster whose supervisor runs the embedded nats-server: the DDP example
trains, the server is SIGKILLed, and while it is down one torch worker is SIGKILLed
too. The supervisor starts the server again (same port, same data folder); every
service and agent reconnects by itself; the agent that saw the exit kept it in its
outbox and sends it once the server is back. The crash is then detected once and
recovered once, nothing healthy is judged silent for the downtime, and the job ends
Succeeded at its final step.

Real processes throughout: nats-server, services, node monitors, agents, gloo workers.
Beside it, the bus alone: every way a service reads (durable consumers, batch
consumers, core subscriptions, KV watches) goes on after the server restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.js.api import DeliverPolicy

from resurge.events import (
    AgentState,
    AgentStateChanged,
    Event,
    FaultDetected,
    JobPhase,
    ProcessExited,
    ProcessStarted,
    Progress,
    RecoveryStarted,
    decode_event,
)
from resurge.local.demo import demo_job, final_step, total_steps
from resurge.local.nats_server import NatsServer
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.e2e.test_agent_killed import gone, trained

pytestmark = pytest.mark.e2e

# Faults that only silence can cause: none may come of the bus being down.
SILENCE_REASONS = {"hang", "agent_lost", "log_rule_timeout", "straggler"}


async def test_every_way_of_reading_goes_on_after_the_server_restarts(
    namespace: str, tmp_path: Path
) -> None:
    server = NatsServer(tmp_path / "nats").start()
    bus = await Bus.connect(Settings(nats_url=server.url, namespace=namespace), "test")
    try:
        await bus.ensure_streams()
        got: dict[str, asyncio.Queue[str]] = {
            way: asyncio.Queue() for way in ("durable", "batch", "core", "kv")
        }
        subject = bus.subjects.raw(None, "agent_state", None)

        async def durable(event: Event) -> None:
            got["durable"].put_nowait(event.id)

        async def batch(events: list[Event]) -> None:
            for event in events:
                got["batch"].put_nowait(event.id)

        async def core(event: Event, _subject: str) -> None:
            got["core"].put_nowait(event.id)

        await bus.consume(subject, "durable", durable)
        await bus.consume_batches(subject, "batch", batch)
        await bus.subscribe(subject, core)
        bucket = await bus.jobs_bucket()
        watcher = await bucket.watch(">")

        async def watch() -> None:
            async for entry in watcher:
                if entry is not None:
                    got["kv"].put_nowait(entry.value.decode())

        follower = asyncio.create_task(watch())
        changes: list[bool] = []
        back = asyncio.Event()

        def changed(connected: bool) -> None:
            changes.append(connected)
            if connected:
                back.set()

        bus.on_connection_change(changed)

        async def one_of_each(detail: str) -> dict[str, str]:
            event = AgentStateChanged(
                source=bus.source, job="j", replica=0, node="n", state=AgentState.RUNNING,
                detail=detail,
            )  # fmt: skip
            await bus.publish(bus.subjects.raw("j", event.kind, "n"), event)
            await bucket.put(detail, event.id.encode())
            # Each way, within less than nats.py's own missed-heartbeat check (10 s).
            seen = {way: await asyncio.wait_for(queue.get(), 5.0) for way, queue in got.items()}
            assert set(seen.values()) == {event.id}, seen
            return seen

        await one_of_each("before")
        assert server.process is not None and server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        await asyncio.to_thread(server.process.wait)
        await asyncio.to_thread(server.start)  # same port, same data folder
        await asyncio.wait_for(back.wait(), 10.0)
        await one_of_each("after")
        assert changes == [False, True]
        assert all(queue.empty() for queue in got.values())  # nothing came twice
        await watcher.stop()  # type: ignore[no-untyped-call]
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    finally:
        await bus.close()
        server.stop()


async def stored(bus: Bus, family: str, subject: str) -> list[Event]:
    """Every event the stream ``family`` (a family's stream: raw, raw-faults, fault...) holds
    on ``subject``."""
    sub = await bus.js.subscribe(
        subject,
        stream=bus.subjects.stream(family),
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
    )
    events: list[Event] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=2.0)
            except TimeoutError:  # the stream holds nothing (more) on the subject
                return events
            events.append(decode_event(msg.data))
            if msg.metadata.num_pending == 0:
                return events
    finally:
        await sub.unsubscribe()


def running(generation: int) -> Callable[[list[Observed]], bool]:
    def test(seen: list[Observed]) -> bool:
        return any(isinstance(o.event, Progress) and o.event.generation == generation
                   for o in seen)  # fmt: skip

    return test


@dataclass
class Outage:
    """What the test saw around the outage, for the assertions after the job."""

    victim: ProcessStarted | None = None
    server_pid: int | None = None
    port: int | None = None
    killed_while_down: bool = False
    back_pid: int | None = None
    back_port: int | None = None
    server_restarts: int = 0


async def test_a_worker_killed_while_nats_is_down_is_recovered_once_after_it_is_back(
    namespace: str, tmp_path: Path
) -> None:
    job = demo_job(tmp_path)
    seen = Outage()

    async def outage(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(trained(15), wait_seconds=90)
        supervisor = watch.supervisor
        assert supervisor is not None and supervisor.server is not None
        server = supervisor.server
        assert server.process is not None and server.pid is not None
        seen.server_pid, seen.port = server.pid, server.port
        [victim] = [o.event for o in watch.observed
                    if isinstance(o.event, ProcessStarted) and o.event.generation == 0
                    and o.event.replica == 1 and o.event.local_rank == 1]  # fmt: skip
        seen.victim = victim

        os.kill(server.pid, signal.SIGKILL)
        await asyncio.to_thread(server.process.wait)
        os.kill(victim.pid, signal.SIGKILL)
        seen.killed_while_down = server.pid is None  # the supervisor waits 0.5 s first

        # The server is back, the exit was sent, and the job runs its next generation.
        await watch.wait_for(running(1), wait_seconds=90)
        seen.back_pid, seen.back_port = server.pid, server.port
        seen.server_restarts = supervisor.server_restarts

    result = await run_job(
        job, state_dir=tmp_path, namespace=namespace, nodes=2, gpus_per_node=2,
        wait_seconds=120, during=outage,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == total_steps(job)
    # The worker died while the server was down, and the supervisor brought the same
    # server back once: a new process on the same port.
    victim = seen.victim
    assert victim is not None and seen.killed_while_down and gone(victim.pid)
    assert seen.server_restarts == 1
    assert seen.back_port == seen.port and seen.back_pid not in (None, seen.server_pid)

    # What the cluster stored, read from its data folder once it stopped: this test's
    # own connection came back on its own time, and may have missed what came before.
    with NatsServer(tmp_path / "nats") as server:
        bus = await Bus.connect(Settings(nats_url=server.url, namespace=namespace), "test")
        try:
            faults = await stored(bus, "fault", bus.subjects.fault(job.name, None))
            actions = await stored(bus, "action", bus.subjects.action(job.name))
            exits = await stored(
                bus, "raw-faults", bus.subjects.raw(job.name, "process_exited", None)
            )
        finally:
            await bus.close()
    judged = [f for f in faults if isinstance(f, FaultDetected)]
    print("faults:", [(f.reason, f.rank, f.generation) for f in judged])
    assert len(judged) == len(faults) > 0
    mine = [f for f in judged if f.rank == victim.rank]
    assert [(f.reason, f.evidence.get("signal")) for f in mine] == [("process_killed", "SIGKILL")]
    assert [f.reason for f in judged if f.reason in SILENCE_REASONS] == []
    assert {f.generation for f in judged} == {0}  # one incident, nothing judged after it
    assert len([e for e in actions if isinstance(e, RecoveryStarted)]) == 1
    [recovery] = result.recoveries
    assert recovery.generation == 1
    # The exit the agent kept through the outage is stored once.
    killed = [e for e in exits if isinstance(e, ProcessExited) and e.pid == victim.pid]
    assert [(e.signal, e.expected) for e in killed] == [("SIGKILL", False)]
