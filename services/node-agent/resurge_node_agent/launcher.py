"""``launch`` mode: one agent per replica, driven by commands on ``cmd.<job>.<replica>``.

- Assign(g): a generation older than the one running is ignored, the one running is
  kept; a newer one stops the running workers (reported as expected exits) and starts
  ``nproc`` workers with torchrun's environment for generation g.
- Stop(g): stops workers of generation g or older; ``final`` ends the agent once its
  workers are down.
- A new agent (one per node and incarnation of its worker group) starts from the
  newest command on its subject (older ones are superseded), and ignores a final Stop
  issued before it started while it has had no Assign: that Stop ended an earlier run
  of a job by the same name.
- SIGTERM: stops the workers, then the agent.

Everything it sees is published on ``raw.<job>.<kind>.<node>``: process started and
exited, every output line, and the agent's own state.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from resurge.bus import Bus
from resurge.events import (
    AgentState,
    AgentStateChanged,
    Assign,
    CheckpointSaved,
    Envelope,
    InjectFault,
    LogLine,
    ProcessExited,
    ProcessStarted,
    Progress,
    Stop,
)
from resurge.service import ServiceContext
from resurge.subjects import escape_token
from resurge.worker_env import worker_environment
from resurge_node_agent.forkserver import ForkServerError, ForkServerSpawner
from resurge_node_agent.spawners import PlainSpawner, Spawner
from resurge_node_agent.worker_channel import WorkerChannel, socket_path_for
from resurge_node_agent.workers import Stream, WorkerExit, WorkerGroup

__all__ = ["LaunchAgent", "LaunchConfig"]

# The server deletes an agent's command consumer this long after its agent went away.
AGENT_CONSUMER_INACTIVE_SECONDS = 3600.0


@dataclass(frozen=True)
class LaunchConfig:
    job: str
    replica: int
    node: str
    nproc_per_node: int
    command: Sequence[str]
    working_dir: str | None
    env: dict[str, str]
    stop_grace_seconds: float
    fork_server: bool = True
    preload: tuple[str, ...] = ("torch",)
    incarnation: int = 0


class LaunchAgent:
    def __init__(self, ctx: ServiceContext, config: LaunchConfig) -> None:
        self.ctx = ctx
        self.bus: Bus = ctx.bus
        self.config = config
        self.generation: int | None = None
        self.group: WorkerGroup | None = None
        self.started_at = datetime.now(UTC)
        self.assign: Assign | None = None
        self.spawner: Spawner | None = None
        self.channel = WorkerChannel(
            socket_path_for(config.job, config.replica),
            self._progress,
            self._checkpoint,
            logger=ctx.log,
        )

    async def start(self) -> None:
        await self.channel.start()
        self.ctx.exit_stack.push_async_callback(self.channel.close)
        self.spawner = await self._make_spawner()
        self.ctx.exit_stack.push_async_callback(self.spawner.close)
        self.ctx.exit_stack.push_async_callback(self._shutdown)
        # One consumer per (node, incarnation): an agent started again after a crash goes
        # on where it stopped; a recreated or moved one starts from the newest command,
        # and never shares a consumer with the agent it replaces while that one exits.
        config = self.config
        durable = (
            f"agent-{escape_token(config.job)}-{config.replica}-"
            f"{escape_token(config.node)}-{config.incarnation}"
        )
        await self.bus.consume(
            self.bus.subjects.cmd(config.job, config.replica),
            durable,
            self.on_command,
            expects=(Assign, Stop, InjectFault),
            start="last_per_subject",
            inactive_seconds=AGENT_CONSUMER_INACTIVE_SECONDS,
        )
        if self.generation is None:
            await self._state(AgentState.WAITING, "waiting for an assignment")

    async def _make_spawner(self) -> Spawner:
        if not self.config.fork_server:
            return PlainSpawner()
        try:
            spawner = await ForkServerSpawner.start(self.config.preload)
        except ForkServerError as error:
            self.ctx.log.warning("no fork server (%s); starting workers as new processes", error)
            return PlainSpawner()
        self.ctx.log.info("fork server ready with %s preloaded", ", ".join(self.config.preload))
        return spawner

    async def on_command(self, command: Assign | Stop | InjectFault) -> None:
        if isinstance(command, Assign):
            await self._assign(command)
        elif isinstance(command, Stop):
            await self._stop_command(command)
        else:
            await self._inject(command)

    async def _inject(self, inject: InjectFault) -> None:
        """Break a worker on purpose; ignored unless it targets the running generation."""
        group = self.group
        if group is None or inject.generation != self.generation or inject.time < self.started_at:
            self.ctx.log.info("ignoring %s injection for generation %s", inject.fault,
                              inject.generation)  # fmt: skip
            return
        pid = group.pid_of(inject.local_rank)
        self.ctx.log.warning("injecting %s into local rank %d (pid %s)", inject.fault,
                             inject.local_rank, pid)  # fmt: skip
        if inject.fault == "log":
            await group.emit_line(inject.local_rank, "stderr", inject.line)
        elif pid is not None:
            os.kill(pid, signal.SIGKILL if inject.fault == "crash" else signal.SIGSTOP)

    async def _assign(self, assign: Assign) -> None:
        if self.generation is not None and assign.generation <= self.generation:
            self.ctx.log.info(
                "ignoring assign for generation %d (at %d)", assign.generation, self.generation
            )
            return
        if assign.world_size != sum(slot.nproc for slot in assign.rank_table):
            self.ctx.log.error("assign %s has an inconsistent rank table; ignored", assign.id)
            return
        await self._stop_workers(f"generation {assign.generation} assigned")
        self.generation = assign.generation
        self.assign = assign
        environments = [
            {**self.config.env, **worker_environment(assign, local_rank, self.channel.path)}
            for local_rank in range(self.config.nproc_per_node)
        ]
        generation = assign.generation
        self.group = WorkerGroup(
            self.config.command,
            environments,
            cwd=self.config.working_dir,
            on_start=lambda lr, pid: self._started(generation, lr, pid, assign),
            on_line=lambda lr, stream, line: self._line(generation, lr, stream, line, assign),
            on_exit=lambda exit_: self._exited(generation, exit_, assign),
            echo_prefix=lambda lr: f"[{self._rank(assign, lr)}]:",
            spawner=self.spawner or PlainSpawner(),
        )
        await self.group.start()
        await self._state(AgentState.RUNNING, f"generation {generation} running")
        group = self.group
        self.ctx.spawn(self._await_idle(group, generation))

    async def _await_idle(self, group: WorkerGroup, generation: int) -> None:
        await group.wait()
        if self.group is group:
            await self._state(AgentState.IDLE, f"generation {generation} workers exited")

    async def _stop_command(self, stop: Stop) -> None:
        if self.generation is None and stop.final and stop.time < self.started_at:
            self.ctx.log.info("ignoring a final stop of an earlier run (%s)", stop.reason)
            return
        if self.generation is None or self.generation <= stop.generation:
            await self._stop_workers(stop.reason or f"stop generation {stop.generation}")
        if stop.final:
            await self._state(AgentState.EXITING, stop.reason or "job over")
            self.ctx.stopping.set()

    async def _stop_workers(self, why: str) -> None:
        if self.group is None or not self.group.running:
            return
        if self.generation is not None:
            await self.channel.notify_stop_pending(self.generation, why)
        await self._state(AgentState.STOPPING, why)
        await self.group.stop(self.config.stop_grace_seconds)

    async def _shutdown(self) -> None:
        await self._stop_workers("agent shutting down")

    def _rank(self, assign: Assign, local_rank: int) -> int:
        slot = next(s for s in assign.rank_table if s.replica == self.config.replica)
        return slot.first_rank + local_rank

    def _envelope(self, generation: int, assign: Assign, local_rank: int) -> dict[str, object]:
        return {
            "source": self.bus.source,
            "job": self.config.job,
            "replica": self.config.replica,
            "node": self.config.node,
            "generation": generation,
            "rank": self._rank(assign, local_rank),
            "local_rank": local_rank,
        }

    async def _started(self, generation: int, local_rank: int, pid: int, assign: Assign) -> None:
        event = ProcessStarted(
            pid=pid,
            local_world_size=self.config.nproc_per_node,
            **self._envelope(generation, assign, local_rank),
        )
        await self._publish(event)

    async def _line(
        self, generation: int, local_rank: int, stream: Stream, line: str, assign: Assign
    ) -> None:
        event = LogLine(stream=stream, line=line, **self._envelope(generation, assign, local_rank))
        subject = self.bus.subjects.raw(self.config.job, event.kind, self.config.node)
        await self.bus.publish_nowait(subject, event)

    async def _exited(self, generation: int, exit_: WorkerExit, assign: Assign) -> None:
        event = ProcessExited(
            pid=exit_.pid,
            local_world_size=self.config.nproc_per_node,
            exit_code=exit_.exit_code,
            signal=exit_.signal,
            expected=exit_.expected,
            **self._envelope(generation, assign, exit_.local_rank),
        )
        await self._publish(event)

    async def _progress(self, local_rank: int, step: int, metrics: dict[str, float]) -> None:
        if self.assign is None or self.generation is None:
            return
        event = Progress(
            step=step, metrics=metrics, **self._envelope(self.generation, self.assign, local_rank)
        )
        await self.bus.publish_nowait(
            self.bus.subjects.raw(self.config.job, event.kind, self.config.node), event
        )

    async def _checkpoint(self, local_rank: int, step: int, path: str) -> None:
        if self.assign is None or self.generation is None:
            return
        event = CheckpointSaved(
            step=step, path=path, **self._envelope(self.generation, self.assign, local_rank)
        )
        await self._publish(event)

    async def _state(self, state: AgentState, detail: str) -> None:
        event = AgentStateChanged(
            source=self.bus.source,
            job=self.config.job,
            replica=self.config.replica,
            node=self.config.node,
            generation=self.generation,
            state=state,
            detail=detail,
        )
        await self._publish(event)

    async def _publish(self, event: Envelope) -> None:
        await self.bus.publish(
            self.bus.subjects.raw(self.config.job, event.kind, self.config.node), event
        )
