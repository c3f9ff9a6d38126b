"""A service's background tasks are supervised: a loop that raises is logged, counted and
started again; /livez (a real GET) names a loop that is dead or waiting to restart."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack

import pytest
from prometheus_client import CollectorRegistry

from resurge.runtime.bus import Bus
from resurge.runtime.observability import MetricsServer
from resurge.runtime.service import ServiceContext, _cancel_all
from resurge.runtime.settings import Settings
from tests.http_get import get


async def health(server: MetricsServer) -> tuple[int, str]:
    return await asyncio.to_thread(get, f"http://127.0.0.1:{server.port}/livez")


class Flaky:
    """A loop that raises on its first ``failures`` starts, then runs until cancelled."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.starts = 0
        self.running = asyncio.Event()
        self.raised = asyncio.Event()

    async def run(self) -> None:
        self.starts += 1
        if self.starts <= self.failures:
            self.raised.set()  # its waiter runs once the supervisor took the failure
            raise RuntimeError(f"publish failed (start {self.starts})")
        self.running.set()
        await asyncio.Event().wait()


def context(settings: Settings, bus: Bus) -> ServiceContext:
    return ServiceContext("svc", settings, bus, CollectorRegistry(), AsyncExitStack())


async def test_a_loop_that_raises_is_logged_counted_and_started_again(
    settings: Settings, bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = context(settings, bus)
    ctx.supervisor.backoff_first = 0.01
    flaky = Flaky(failures=2)
    with caplog.at_level(logging.INFO, logger="resurge.svc"):
        ctx.spawn(flaky.run, name="tick")
        await asyncio.wait_for(flaky.running.wait(), 10)
    assert flaky.starts == 3
    assert ctx.registry.get_sample_value("resurge_task_restarts_total", {"task": "tick"}) == 2
    failed = [r for r in caplog.records if "task tick failed" in r.getMessage()]
    assert len(failed) == 2
    assert all(r.exc_info and "publish failed" in str(r.exc_info[1]) for r in failed)
    assert ctx.liveness_problems() == []  # running again, two failures are no crash loop
    await _cancel_all(ctx.tasks)
    assert not ctx.tasks


async def test_a_one_shot_task_that_raises_is_logged_and_counted(
    settings: Settings, bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = context(settings, bus)

    async def carry_out() -> None:
        raise RuntimeError("no responders")

    with caplog.at_level(logging.ERROR, logger="resurge.svc"):
        task = ctx.spawn(carry_out())
        await asyncio.wait([task])
    name = carry_out.__qualname__
    assert ctx.registry.get_sample_value("resurge_task_failures_total", {"task": name}) == 1
    assert any(r.exc_info and name in r.getMessage() for r in caplog.records)
    assert ctx.liveness_problems() == []  # whoever spawned a one-shot task recovers from it


async def test_livez_is_unhealthy_while_a_loop_waits_to_restart_or_has_ended(
    settings: Settings, bus: Bus
) -> None:
    ctx = context(settings, bus)
    ctx.supervisor.backoff_first = 600.0  # the failed loop waits for the whole test
    server = MetricsServer(
        ctx.registry, ctx.liveness_problems, ctx.problems, "127.0.0.1", 0
    ).start()
    try:
        running = Flaky(failures=0)
        ctx.spawn(running.run, name="follow-jobs")
        await running.running.wait()
        assert await health(server) == (200, "ok\n")

        failing = Flaky(failures=1)
        ctx.spawn(failing.run, name="tick")
        await failing.raised.wait()
        status, body = await health(server)
        assert status == 503
        assert body.startswith("unhealthy: task tick failed; restarting in ")

        ended = asyncio.Event()

        async def watch() -> None:
            ended.set()  # and returns: a watch whose watcher ended

        ctx.spawn(watch, name="watch")
        await ended.wait()
        status, body = await health(server)
        assert status == 503
        assert "unhealthy: task watch ended\n" in body
        assert "follow-jobs" not in body
    finally:
        server.close()
        await _cancel_all(ctx.tasks)  # a loop waiting out its backoff is cancelled too
    assert not ctx.tasks


async def test_livez_names_a_loop_that_keeps_failing(settings: Settings, bus: Bus) -> None:
    ctx = context(settings, bus)
    ctx.supervisor.backoff_first = ctx.supervisor.backoff_max = 0.0
    flaky = Flaky(failures=5)
    ctx.spawn(flaky.run, name="heartbeat")
    await asyncio.wait_for(flaky.running.wait(), 10)
    assert ctx.liveness_problems() == ["task heartbeat failed 5 times in 300 s"]
    await _cancel_all(ctx.tasks)


async def test_readyz_waits_for_setup_and_livez_fails_once_the_bus_is_closed_for_good(
    settings: Settings,
) -> None:
    """A bus that is down reconnects by itself (no liveness problem: see
    test_health_probes.py); a closed one never does, and only a new process helps."""
    bus = await Bus.connect(settings, "svc")
    ctx = context(settings, bus)
    assert ctx.liveness_problems() == []
    assert ctx.problems() == ["starting"]
    ctx.started = True
    assert ctx.problems() == []
    await bus.close()
    assert ctx.liveness_problems() == ["nats connection closed"]
    assert ctx.problems() == ["nats connection closed"]


async def test_failures_while_the_bus_is_down_make_no_liveness_problem_then_or_later(
    settings: Settings, bus: Bus
) -> None:
    """A loop failing because NATS is down (its publish, its KV read) is retried, but a
    restart would not cure it: neither its backoff nor its count of failures fails /livez,
    during the outage or after it (the supervisor's ``excused``, which a service ties to
    its bus being down; toggled here by hand)."""
    ctx = context(settings, bus)
    outage = True
    ctx.supervisor.excused = lambda: outage
    ctx.supervisor.backoff_first = ctx.supervisor.backoff_max = 0.0
    flaky = Flaky(failures=6)
    ctx.spawn(flaky.run, name="reconcile")
    await asyncio.wait_for(flaky.running.wait(), 10)
    assert ctx.supervisor.problems() == []
    outage = False
    assert ctx.supervisor.problems() == [], "failures of the outage counted after it"
    ctx.supervisor.backoff_first = 600.0
    failing = Flaky(failures=1)
    ctx.spawn(failing.run, name="tick")
    await failing.raised.wait()
    assert [p.split(";")[0] for p in ctx.supervisor.problems()] == ["task tick failed"]
    await _cancel_all(ctx.tasks)
