"""The bench's side of the simulated agents: start them, hear them, wait on what they say.

:class:`Fleet` starts the agent processes of bench/scale_agents.py (replicas split
evenly over ``processes``), listens on their report subject, and keeps per generation
when each replica held its Assign and when it sent its first step. :meth:`Fleet.until`
waits for a condition over what was heard (each report wakes it; no polling), and
:func:`start_service` starts one real resurge service as a process, its output in a
log file the caller reads on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from nats.aio.msg import Msg
from scale_agents import GOT
from scale_nats import Nats

from resurge.local.nats_server import free_port
from resurge.runtime.bus import Bus

__all__ = ["Fleet", "last_error", "start_service", "stop_all", "until_consumer"]

AGENTS = Path(__file__).resolve().parent / "scale_agents.py"
READY_SECONDS, READY_SECONDS_PER_AGENT = 30.0, 0.01


def last_error(log: Path) -> str:
    """The last line of ``log`` (the services' and agents' output) that names an error,
    to say why a point failed; "" if none does."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    found = [line.strip() for line in lines if "rror" in line or "exceeded" in line]
    return found[-1][:300] if found else ""


def start_service(
    module: str, nats: Nats, namespace: str, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """``python -m module`` (a resurge service) on ``nats`` in ``namespace``."""
    env = {**nats.env(namespace), "RESURGE_METRICS_PORT": str(free_port())}
    return subprocess.Popen(
        [sys.executable, "-m", module], env=env, stdout=log, stderr=subprocess.STDOUT
    )


async def until_consumer(bus: Bus, stream: str, name: str, seconds: float = 120) -> None:
    """Until the durable consumer ``name`` on ``stream`` exists (a service is up once
    its consumer is): asked every 0.1 s, since another process makes it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            await bus.js.consumer_info(bus.subjects.stream(stream), name)
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no consumer {name} on {stream} within {seconds} s")


def stop_all(children: list[subprocess.Popen[bytes]]) -> None:
    """Terminate ``children`` and wait for each (killed after 20 s)."""
    for child in children:
        child.terminate()
    for child in children:
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


class Fleet:
    """The agent processes of one job and what they report."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.held: dict[int, dict[int, float]] = {}  # generation -> replica -> epoch s
        self.stepped: dict[int, dict[int, float]] = {}
        self.ready = 0
        self.children: list[subprocess.Popen[bytes]] = []
        self.heard = asyncio.Event()

    async def listen(self) -> None:
        async def on_got(msg: Msg) -> None:
            words = msg.data.decode().split()
            if words[0] == "ready":
                self.ready += 1
            else:
                generation, replica = int(words[1]), int(words[2])
                self.held.setdefault(generation, {})[replica] = float(words[3])
                if float(words[4]):
                    self.stepped.setdefault(generation, {})[replica] = float(words[4])
            self.heard.set()

        await self.bus.nc.subscribe(GOT, cb=on_got, pending_msgs_limit=1_000_000)

    def poke(self) -> None:
        """Wake :meth:`until` (for a condition over something else the caller hears)."""
        self.heard.set()

    async def until(self, test: Callable[[], bool], seconds: float, what: str) -> None:
        """Return once ``test()`` holds; TimeoutError naming ``what`` after ``seconds``."""
        deadline = time.monotonic() + seconds
        while not test():
            self.heard.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.heard.wait(), left)

    async def start(
        self,
        nats: Nats,
        namespace: str,
        job: str,
        replicas: int,
        per_node: int,
        processes: int,
        log: IO[bytes],
        respond: bool,
        spare_from: int | None = None,
    ) -> float:
        """Start agents for replicas 0..``replicas - 1`` (from ``spare_from`` on, on
        the node of that replica); seconds until all are ready."""
        began = time.monotonic()
        per = -(-replicas // processes)
        for first in range(0, replicas, per):
            last = min(replicas, first + per)
            self.children.append(
                subprocess.Popen(  # noqa: ASYNC220 (started before the timed part)
                    [
                        *(sys.executable, str(AGENTS), nats.url, namespace),
                        *(str(nats.stream_replicas), job, str(first), str(last), str(per_node)),
                        *(["--respond"] if respond else []),
                        *([f"--spare-from={spare_from}"] if spare_from is not None else []),
                    ],
                    env=nats.env(namespace),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        count = len(self.children)
        # Longer than any start seen here (4,096 agents: under 40 s on a loaded machine).
        deadline = time.monotonic() + READY_SECONDS + READY_SECONDS_PER_AGENT * replicas
        while True:  # every 5 s, whether an agent process died (its log says why)
            try:
                await self.until(lambda: self.ready == count, 5, "the agents' inboxes")
                return time.monotonic() - began
            except TimeoutError:
                dead = [c.args for c in self.children if c.poll() is not None]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{replicas} agents not ready in {time.monotonic() - began:.0f} s; "
                        f"processes exited: {len(dead)}"
                    ) from None

    def stop(self) -> None:
        stop_all(self.children)
        self.children = []
