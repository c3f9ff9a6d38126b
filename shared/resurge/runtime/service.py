"""The runner every service's ``main`` uses.

Order: configure logging, load settings once, then inside an ``AsyncExitStack`` connect
the bus, create streams, start ``/metrics``, ``/livez`` and ``/readyz``, call the
service's ``setup``, and freeze what start-up built out of the garbage collector. SIGTERM and
SIGINT set ``ctx.stopping``; a service may set it itself when its work is over. On the
way out the background tasks are cancelled, then the exit stack drains the bus and
stops the server. Exit 2 means the service could not start (NATS unreachable or
refusing it); a connection that breaks while a started service stops is logged, and
the exit is 0.

Every background task of a service goes through :meth:`ServiceContext.spawn`, which
supervises it (:mod:`resurge.runtime.supervision`: a loop that raises is logged,
counted and restarted).

Health, as Kubernetes' probes read it: ``/livez`` (liveness: a failure restarts the
process) is 503 only while a loop is dead, waiting out a restart's backoff or
crash-looping, or the bus is closed for good: what a new process would cure. The bus
being down is not: NATS comes back and the bus reconnects by itself, and a restarted
process would lose what waits in memory for it (a node monitor's outbox of GPU
errors). ``/readyz`` (readiness) is 503 for all of that, and while setup runs or the
bus is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from resurge.runtime.bus import Bus
from resurge.runtime.logs import configure_logging
from resurge.runtime.observability import MetricsServer
from resurge.runtime.settings import Settings
from resurge.runtime.supervision import Supervisor, Work

__all__ = ["ServiceContext", "run_service"]

S = TypeVar("S", bound=Settings)

_RECANCEL_SECONDS = 1.0


@dataclass
class ServiceContext:
    """What a service's setup gets: its settings, bus, metrics registry and exit stack."""

    name: str
    settings: Settings
    bus: Bus
    registry: CollectorRegistry
    exit_stack: AsyncExitStack
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    supervisor: Supervisor = field(init=False)
    started: bool = False
    """Set once the service's setup returned."""

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(
            self.log, self.registry, excused=lambda: not self.bus.connected
        )

    @property
    def log(self) -> logging.Logger:
        """The service's logger, ``resurge.<name>``."""
        return logging.getLogger(f"resurge.{self.name}")

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        """The background tasks now running; cancelled when the service stops."""
        return self.supervisor.tasks

    def spawn(self, work: Work, *, name: str | None = None) -> asyncio.Task[None]:
        """Run ``work`` in the background, supervised, until the service stops: a
        coroutine runs once (a failure is logged and counted); a function making a
        coroutine is a loop, started again whenever it raises."""
        return self.supervisor.spawn(work, name=name)

    def liveness_problems(self) -> list[str]:
        """Why the process should be restarted (``/livez``); empty while it is alive."""
        found = ["nats connection closed"] if self.bus.nc.is_closed else []
        return found + self.supervisor.problems()

    def problems(self) -> list[str]:
        """Why the service cannot work now (``/readyz``); empty while it is ready."""
        found = [] if self.started else ["starting"]
        if not self.bus.connected and not self.bus.nc.is_closed:
            found.append("not connected to nats")
        return found + self.liveness_problems()


async def _serve(
    name: str,
    settings: Settings,
    setup: Callable[[ServiceContext], Awaitable[None]],
    manage_streams: bool,
) -> int:
    registry = CollectorRegistry()
    ready = False
    try:
        async with AsyncExitStack() as stack:
            bus = await Bus.connect(settings, name, registry)
            stack.push_async_callback(bus.close)
            await bus.ensure_streams(update=manage_streams)
            ctx = ServiceContext(name, settings, bus, registry, stack)
            if settings.metrics_port is not None:
                server = MetricsServer(
                    registry,
                    ctx.liveness_problems,
                    ctx.problems,
                    settings.metrics_host,
                    settings.metrics_port,
                ).start()
                stack.callback(server.close)
                ctx.log.info("serving /metrics, /livez and /readyz on port %d", server.port)
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, ctx.stopping.set)
            # SIGQUIT: every thread's stack at once (faulthandler, even while the loop is
            # blocked), then, from the loop, where each of its tasks waits: an idle loop
            # whose work is stuck shows only a select() in the threads' stacks.
            faulthandler.unregister(signal.SIGQUIT)  # re-registered in front of the loop's
            loop.add_signal_handler(signal.SIGQUIT, _print_tasks)
            faulthandler.register(signal.SIGQUIT, all_threads=True, chain=True)
            await setup(ctx)
            # What start-up built (modules, models, schemas, clients) lives as long as the
            # process: frozen out of the collector, whose every full pass would otherwise
            # walk it (about 30 ms in a service, at any moment: a fault's handling included).
            gc.collect()
            gc.freeze()
            ctx.started = ready = True
            ctx.log.info("%s ready", name)
            await ctx.stopping.wait()
            ctx.log.info("%s stopping", name)
            await _cancel_all(ctx.tasks)
    except ConnectionError:
        if not ready:
            raise  # could not start: run_service's exit 2
        # A connection that breaks while a started service stops (NATS gone or reset
        # at that moment) loses only what was still to be sent: the stop succeeded.
        logging.getLogger(f"resurge.{name}").warning(
            "the connection broke while stopping", exc_info=True
        )
    # A task the client library leaves behind would hold asyncio.run's exit for ever if
    # it lost its cancel (a subscription's task whose callback was cancelled inside
    # Python 3.11's wait_for goes back to waiting for messages): cancelled until done.
    await _cancel_all({t for t in asyncio.all_tasks() if t is not asyncio.current_task()})
    return 0


def _print_tasks() -> None:
    tasks = asyncio.all_tasks()
    print(f"{len(tasks)} asyncio tasks:", file=sys.stderr)
    for task in tasks:
        print(f"- {task.get_name()} ({task!r}), awaiting:", file=sys.stderr)
        for line in _await_chain(task.get_coro()):
            print(f"    {line}", file=sys.stderr)
    sys.stderr.flush()


def _await_chain(awaitable: object) -> list[str]:
    """Where a coroutine waits, each coroutine or async generator it awaits down to the
    innermost (a task's own stack shows only its outermost frame), then what that
    awaits (a future, a queue's getter)."""
    lines: list[str] = []
    for _ in range(64):  # a chain is short; a cycle is not followed
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "ag_frame", None)
        frame = frame or getattr(awaitable, "gi_frame", None)
        if frame is None:
            lines.append(repr(awaitable)[:300])
            break
        code = frame.f_code
        lines.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        awaitable = (
            getattr(awaitable, "cr_await", None)
            or getattr(awaitable, "ag_await", None)
            or getattr(awaitable, "gi_yieldfrom", None)
        )
        if awaitable is None:
            break
    return lines


async def _cancel_all(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again any that swallowed the
    cancel (on Python 3.11 ``asyncio.wait_for``, inside nats.py's requests, can lose a
    cancel that arrives with the reply)."""
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=_RECANCEL_SECONDS)
    for task in list(tasks):
        with contextlib.suppress(asyncio.CancelledError):
            await task


def run_service(
    name: str,
    settings: S,
    setup: Callable[[ServiceContext], Awaitable[None]],
    *,
    manage_streams: bool = True,
) -> int:
    """Run a service until SIGTERM/SIGINT or until it sets ``ctx.stopping``.

    ``manage_streams`` False (node agents): the streams are only created where missing,
    never updated, as an agent's NATS user may not change them."""
    configure_logging(name, settings.log_level, settings.log_format)
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    try:
        return asyncio.run(_serve(name, settings, setup, manage_streams))
    except ConnectionError as error:  # raised only by a service that could not start
        logging.getLogger(f"resurge.{name}").error("%s", error)
        return 2
