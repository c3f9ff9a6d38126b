"""``launch`` mode: one agent per replica, driven by commands on ``cmd.<job>.<replica>``.

The agent runs what its :class:`~resurge.cluster.protocol.WorkerGroupSpec` says: ``nproc``
workers of ``command`` with ``env`` in ``working_dir``, on ``node``.

- Assign(g): a generation older than the one running is ignored, the one running is
  kept; a newer one stops the running workers as a Stop does, with the configured
  ``stop_grace_seconds`` (reported as expected exits), and starts ``nproc`` workers with
  torchrun's environment for generation g.
- Rendezvous: the agent of the replica that holds rank 0 hosts generation g's c10d
  store at ``MASTER_PORT`` (:mod:`.rendezvous`, as torchrun's agent does), given to a
  standby store process (forked once the generation before joined its store, else as
  the Assign comes) and up before the workers start; every worker gets
  ``TORCHELASTIC_USE_AGENT_STORE=True`` and connects to it as a client. Once all
  ``world_size`` ranks have joined it the agent publishes RendezvousPassed, once per
  generation. The next generation's store replaces it. It is hosted where the fork
  server's preloads imported ``torch.distributed`` (``torch`` by default, or
  ``lightning`` ...); otherwise, or when the store is not up
  within ``STORE_READY_SECONDS``, rank 0's own script hosts it (its
  ``TORCHELASTIC_USE_AGENT_STORE`` is ``False``), as before, and nothing is published.
  Where the spec lets rank 0's agent host it, the agent of every other replica starts
  its workers once the store accepts connections (:mod:`.store_probe`: a torch store
  client refused once backs off half a second), saying so (AgentStateChanged
  ``waiting``) when it has to wait; after the job's stop grace plus
  ``STORE_READY_SECONDS`` it starts them anyway.
- ``MASTER_ADDR`` as a DNS name (a pod's on Kubernetes' pod network): before it starts
  workers the agent waits until the name resolves (:mod:`.master_name`), saying so
  (AgentStateChanged ``waiting``, a log line) when it has to wait; after
  ``MASTER_RESOLVE_SECONDS`` it starts them anyway.
- Assign(g, level ``in_process``): where every running worker is alive, connected and
  runs under ``resurge.worker.restartable``, no process stops: each gets ``restart``
  with its complete environment for generation g, and the agent waits up to
  ``rejoin_timeout_seconds`` for each to confirm (``rejoining``). From the moment the
  restart is sent the agent is at generation g: its state, log lines and exits carry g;
  reports carry the generation their worker says it is in. Where a worker cannot
  restart in-process, or does not confirm in time, or exits meanwhile, the agent
  escalates by itself: it says so (AgentStateChanged ``stopping``, detail "escalated to
  a process restart: ..."), stops the workers and starts new ones for the same Assign,
  with a new rendezvous store where it hosts the store (ranks that rejoined left their
  addresses in the old one).
- An Assign that places this replica on another node (it moved) is ignored: the agent
  there runs it, and this one is being removed.
- Stop(g): stops workers of generation g or older: SIGTERM, then SIGKILL after
  ``timeout_seconds`` (at once when ``graceful`` is false); workers that cannot act on
  SIGTERM are SIGKILLed at once: the ranks in ``hung_ranks`` and any worker that is
  stopped (state T), also one that stops during the grace. The grace ends as soon as
  every worker has exited. ``final`` ends the agent once its workers are down.
- Workers die with their agent, however the agent dies: a parent-death signal on each
  worker and on the fork server that forks them (:mod:`.parent_death`).
- A worker that stops without exiting (SIGSTOP, a debugger), or runs again, is
  reported (ProcessStateChanged), sampled every ``STATE_SAMPLE_SECONDS``.
- Commands come through a :class:`~resurge.runtime.command_inbox.CommandInbox` (a
  core subscription, caught up from the command stream; no consumer in the server):
  each is acted on once, also one published while the agent was disconnected. A new
  agent (one per node and incarnation of its worker group) starts from the newest
  command on its subject (older ones are superseded); one started again after a crash
  (same node, incarnation and run) goes on after the last command it handled. A command
  that names another run (``uid``) than the agent's worker group is ignored: a job
  deleted and submitted again under its name is a new run, and its agents never act on
  the old run's commands. It also ignores a
  final Stop issued before it started while it has had no Assign: that Stop ended an
  earlier run of a job by the same name.
- CheckpointNow(g): for the generation it runs, the agent passes the request on
  (``checkpoint_now``, with its ``hold_seconds``) to every worker connected through
  ``resurge.worker``; they save and report a checkpoint, published as CheckpointSaved
  like any other, and hold after it when asked to. Workers not
  connected (plain torchrun scripts) are left alone, and the log says which were asked
  and which were not. A request for another generation, or one sent before the agent
  started, is ignored.
- SIGTERM: stops the workers, then the agent. Either way it ends, its last state is
  ``exiting``, said once (a final Stop's reason, else "agent shutting down").

Everything it sees is published on ``raw.<job>.<kind>.<node>``: process started and
exited (with the worker's last output lines), every output line, the agent's own state,
the rendezvous of a generation whose store it hosts, and its workers' reports: progress
(``in_process`` true for restartable workers), checkpoints, where each worker's
registered state came from as its generation began (StateRestored), and the exceptions
restartable workers caught (WorkerFault). It is all published through an
:class:`~resurge.runtime.outbox.Outbox`: while NATS is down the agent goes on (nothing
waits on the bus) and its events wait, in order, to be sent once it is back; a full
outbox drops the oldest log lines and progress reports first, never an exit, a state
or a fault. InjectFault ``exception`` makes a restartable
worker raise inside its training function; other workers are left alone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.contract.subscriptions import LAUNCH_COMMANDS, Scope
from resurge.events import (
    AgentState,
    AgentStateChanged,
    Assign,
    CheckpointNow,
    CheckpointSaved,
    Envelope,
    InjectFault,
    LogLine,
    ProcessExited,
    ProcessStarted,
    ProcessStateChanged,
    Progress,
    RecoveryLevel,
    RendezvousPassed,
    StateRestored,
    Stop,
    StopFirst,
    WorkerFault,
)
from resurge.runtime.bus import Bus
from resurge.runtime.command_inbox import CommandInbox, position_key
from resurge.runtime.outbox import Outbox
from resurge.runtime.service import ServiceContext
from resurge.worker.environment import SNAPSHOT_DIR
from resurge.worker.wire import (
    CheckpointReport,
    FaultReport,
    Hello,
    ProgressReport,
    Rejoining,
    RestoreReport,
    raise_line,
    restart_line,
)
from resurge_node_agent.launch.forkserver import ForkServerError, ForkServerSpawner
from resurge_node_agent.launch.in_process import Rejoins, restartable_workers
from resurge_node_agent.launch.master_name import until_resolves
from resurge_node_agent.launch.process_state import is_stopped
from resurge_node_agent.launch.rendezvous import HostedStore
from resurge_node_agent.launch.spawners import PlainSpawner, Spawner
from resurge_node_agent.launch.store_probe import until_listening
from resurge_node_agent.launch.worker_channel import Report, WorkerChannel, socket_path_for
from resurge_node_agent.launch.worker_env import (
    AGENT_STORE_ENV,
    checkpoint_environment,
    worker_environment,
)
from resurge_node_agent.launch.workers import Stream, WorkerExit, WorkerProcesses
from resurge_node_agent.private import worker_base_environment

__all__ = ["LaunchAgent"]

# How often the agent reads its workers' process states (a /proc read per worker).
STATE_SAMPLE_SECONDS = 0.25
# How long the workers' start waits for the rendezvous store the agent hosts (forked from
# the fork server it is up in milliseconds); past it, rank 0's script hosts it.
STORE_READY_SECONDS = 10.0
# How long the workers' start waits for MASTER_ADDR's DNS record (a new pod's appears
# within seconds); past it, the workers start and fail their rendezvous, a fault.
MASTER_RESOLVE_SECONDS = 60.0


@dataclass
class _Running:
    """The running workers' Assign (in-process restarts move it on) and environments."""

    assign: Assign
    environments: list[dict[str, str]]


class LaunchAgent:
    """One replica's agent: runs the workers ``spec`` describes, one generation after
    another, as the commands on ``cmd.<job>.<replica>`` say (see the module docstring)."""

    def __init__(self, ctx: ServiceContext, spec: WorkerGroupSpec) -> None:
        self.ctx = ctx
        self.bus: Bus = ctx.bus
        self.spec = spec
        self.generation: int | None = None
        self.workers: WorkerProcesses | None = None
        self.running: _Running | None = None
        self.started_at = datetime.now(UTC)
        self._said_exiting = False
        self.assign: Assign | None = None
        self.spawner: Spawner | None = None
        self.rejoins: Rejoins | None = None
        self.store: HostedStore | None = None
        # A store process ready for the next generation, and where stores' pipes go.
        self.standby: HostedStore | None = None
        self.preparing = False
        self.store_folder: Path | None = None
        self.channel = WorkerChannel(
            socket_path_for(spec.job, spec.replica), on_report=self._report, logger=ctx.log
        )
        self.outbox = Outbox(self.bus, ctx.registry)
        # The job's spec.checkpoint; the job's own env may still set the variables.
        self.checkpoint_env = checkpoint_environment(spec, os.environ)

    async def start(self) -> None:
        """Open the worker socket and the fork server, then take commands; the service's
        exit stack stops the workers and closes both."""
        await self.channel.start()
        self.ctx.exit_stack.push_async_callback(self.channel.close)
        self.spawner = await self._make_spawner()
        self.ctx.exit_stack.push_async_callback(self.spawner.close)
        # Not a task of the context's: it outlives them, to send the last states and exits.
        self.outbox.start()
        self.ctx.exit_stack.push_async_callback(self.outbox.close)
        self.ctx.exit_stack.push_async_callback(self._shutdown)
        # One position per (node, incarnation, run): an agent started again after a crash goes
        # on where it stopped; a recreated or moved one starts from the newest command.
        spec = self.spec
        inbox = CommandInbox.declared(
            self.bus,
            LAUNCH_COMMANDS,
            Scope(job=spec.job, replica=spec.replica),
            self.on_command,
            position_key=position_key(
                spec.node, spec.job, spec.replica, spec.incarnation, spec.uid
            ),
        )
        await inbox.start()
        self.ctx.exit_stack.push_async_callback(inbox.close)
        if self.generation is None:
            await self._state(AgentState.WAITING, "waiting for an assignment")

    async def _make_spawner(self) -> Spawner:
        if not self.spec.fork_server:
            return PlainSpawner()
        try:
            spawner = await ForkServerSpawner.start(self.spec.preload)
        except ForkServerError as error:
            self.ctx.log.warning("no fork server (%s); starting workers as new processes", error)
            return PlainSpawner()
        self.ctx.log.info("fork server ready with %s preloaded", ", ".join(self.spec.preload))
        return spawner

    async def on_command(self, command: Assign | Stop | InjectFault | CheckpointNow) -> None:
        """Act on one command to this replica (of this agent's run)."""
        if command.uid is not None and self.spec.uid and command.uid != self.spec.uid:
            self.ctx.log.info(
                "ignoring %s of generation %s: it is for run %s of %s, this agent runs %s",
                command.kind,
                command.generation,
                command.uid,
                self.spec.job,
                self.spec.uid,
            )
            return
        if isinstance(command, Assign):
            await self._assign(command)
        elif isinstance(command, Stop):
            await self._stop_command(command)
        elif isinstance(command, CheckpointNow):
            self._request_checkpoint(command)
        else:
            await self._inject(command)

    def _request_checkpoint(self, request: CheckpointNow) -> None:
        """Pass a checkpoint request on to the connected workers of the running generation."""
        workers = self.workers
        if (
            workers is None
            or request.generation != self.generation
            or request.time < self.started_at
        ):
            self.ctx.log.info(
                "ignoring a checkpoint request for generation %d (running %s)",
                request.generation,
                self.generation,
            )
            return
        asked = self.channel.request_checkpoint(
            request.generation, request.reason, request.hold_seconds
        )
        others = sorted(set(workers.running_pids()) - set(asked))
        self.ctx.log.info(
            "asked local ranks %s of generation %d for a checkpoint (%s)%s%s",
            asked or "none",
            request.generation,
            request.reason or "no reason given",
            f", then to hold up to {request.hold_seconds:g} s" if request.hold_seconds else "",
            f"; not connected through resurge.worker, left alone: {others}" if others else "",
        )

    async def _inject(self, inject: InjectFault) -> None:
        """Break a worker on purpose; ignored unless it targets the running generation."""
        workers = self.workers
        if workers is None or inject.generation != self.generation or inject.time < self.started_at:
            self.ctx.log.info(
                "ignoring %s injection for generation %s", inject.fault, inject.generation
            )
            return
        pid = workers.pid_of(inject.local_rank)
        if inject.fault == "exception":
            self._inject_exception(inject, pid)
            return
        self.ctx.log.warning(
            "injecting %s into local rank %d (pid %s)", inject.fault, inject.local_rank, pid
        )
        if inject.fault == "log":
            await workers.emit_line(inject.local_rank, "stderr", inject.line)
        elif pid is not None:
            os.kill(pid, signal.SIGKILL if inject.fault == "crash" else signal.SIGSTOP)

    def _inject_exception(self, inject: InjectFault, pid: int | None) -> None:
        hello = None if pid is None else self.channel.worker(inject.local_rank, pid)
        if hello is None or not hello.in_process:
            self.ctx.log.warning(
                "not injecting an exception into local rank %d: it does not run under "
                "resurge.worker.restartable",
                inject.local_rank,
            )
            return
        self.ctx.log.warning(
            "injecting an exception into local rank %d (pid %s)", inject.local_rank, pid
        )
        self.channel.send(inject.local_rank, raise_line(hello.generation), pid=pid)

    def _environments(self, assign: Assign, agent_store: bool) -> list[dict[str, str]]:
        environments = [
            {
                **self.checkpoint_env,
                **self.spec.env,
                **worker_environment(assign, local_rank, self.channel.path),
            }
            for local_rank in range(self.spec.nproc)
        ]
        if not agent_store:  # rank 0's script hosts the store (a client elsewhere anyway)
            for env in environments:
                env[AGENT_STORE_ENV] = "False"
        return environments

    def _can_host_store(self) -> bool:
        """Whether a store process would fork from a server that has torch.distributed
        imported, by whichever preload module (a new interpreter would pay torch's import
        before any worker could start)."""
        spawner = self.spawner
        return (
            isinstance(spawner, ForkServerSpawner)
            and spawner.server_pid is not None
            and spawner.has_torch_distributed
        )

    def _host_store(self, assign: Assign) -> asyncio.Task[HostedStore | None] | None:
        """Start ``assign``'s store where this replica holds rank 0 (see the module
        docstring); a task, awaited by :meth:`_store_ready` before the workers start."""
        slot = assign.slot(self.spec.replica)
        if slot is None or slot.first_rank != 0 or not self._can_host_store():
            return None

        async def joined() -> None:
            await self._publish(
                RendezvousPassed(
                    source=self.bus.source,
                    job=self.spec.job,
                    replica=self.spec.replica,
                    node=self.spec.node,
                    generation=assign.generation,
                    world_size=assign.world_size,
                )
            )

            # The next generation's store forks now, off the critical path.
            self.ctx.spawn(self._prepare_standby())

        async def start() -> HostedStore | None:
            store, self.standby = self.standby, None
            try:
                if store is None:
                    store = await self._prepare_store()
                if await store.host(assign.master_port, assign.world_size, joined):
                    return store
            except (OSError, ForkServerError) as error:
                self.ctx.log.warning("could not start the rendezvous store: %s", error)
            if store is not None:
                await store.close()
            return None

        return asyncio.create_task(start(), name=f"store-g{assign.generation}")

    async def _prepare_store(self) -> HostedStore:
        if self.store_folder is None:
            self.store_folder = Path(tempfile.mkdtemp(prefix="resurge-store-"))
        env = worker_base_environment(os.environ)
        spawner = self.spawner or PlainSpawner()
        return await HostedStore.prepare(spawner, env, self.store_folder, self.ctx.log)

    async def _prepare_standby(self) -> None:
        """A standby store for the next generation, unless one is there or on its way."""
        if self.standby is not None or self.preparing or not self._can_host_store():
            return
        self.preparing = True
        try:
            standby = await self._prepare_store()
        except (OSError, ForkServerError) as error:
            self.ctx.log.warning("could not start a standby rendezvous store: %s", error)
            return
        finally:
            self.preparing = False
        if self.standby is None:
            self.standby = standby
        else:
            await standby.close()

    async def _store_ready(
        self, assign: Assign, hosting: asyncio.Task[HostedStore | None] | None
    ) -> bool:
        """Whether ``assign``'s workers may use the agent's store: it is up, or another
        agent hosts it (this replica has no rank 0: awaited until it accepts
        connections). A store not up in time is closed."""
        if hosting is None:
            if self._rank(assign, 0) == 0:
                return False  # rank 0's own script hosts it
            if self._can_host_store():
                # Rank 0's agent hosts it, as this one would in its place (one spec, the
                # same preloads).
                await self._await_store(assign)
            return True
        store = await hosting
        if store is not None and await store.listening(STORE_READY_SECONDS):
            self.store = store
            return True
        self.ctx.log.warning(
            "the rendezvous store is not up after %g s; rank 0's script hosts it",
            STORE_READY_SECONDS,
        )
        if store is not None:
            await store.close()
        return False

    async def _await_store(self, assign: Assign) -> None:
        """Until the store another agent hosts for ``assign`` accepts connections, or its
        stop grace plus ``STORE_READY_SECONDS`` passed (see the module docstring)."""
        where = f"{assign.master_addr}:{assign.master_port}"

        async def waiting() -> None:
            detail = f"generation {assign.generation}: waiting for the rendezvous store at {where}"
            await self._state(AgentState.WAITING, detail)

        bound = self.spec.stop_grace_seconds + STORE_READY_SECONDS
        if not await until_listening(assign.master_addr, assign.master_port, bound, waiting):
            self.ctx.log.warning(
                "the rendezvous store at %s is not up after %g s; starting the workers anyway",
                where,
                bound,
            )

    async def _await_master_name(self, assign: Assign) -> None:
        """Until ``assign``'s MASTER_ADDR resolves, or ``MASTER_RESOLVE_SECONDS`` passed
        (see the module docstring)."""
        host, waited = assign.master_addr, False

        async def waiting() -> None:
            nonlocal waited
            waited = True
            detail = f"generation {assign.generation}: waiting for MASTER_ADDR {host} to resolve"
            self.ctx.log.info("%s", detail)
            await self._state(AgentState.WAITING, detail)

        if not await until_resolves(host, MASTER_RESOLVE_SECONDS, waiting):
            self.ctx.log.warning(
                "MASTER_ADDR %s does not resolve after %g s; starting the workers anyway",
                host,
                MASTER_RESOLVE_SECONDS,
            )
        elif waited:
            self.ctx.log.info("MASTER_ADDR %s resolves", host)

    async def _assign(self, assign: Assign) -> None:
        if self.generation is not None and assign.generation <= self.generation:
            self.ctx.log.info(
                "ignoring assign for generation %d (at %d)", assign.generation, self.generation
            )
            return
        mine = assign.slot(self.spec.replica)
        if mine is None:
            self.ctx.log.error(
                "assign %s lists no slot for replica %d; ignored", assign.id, self.spec.replica
            )
            return
        if assign.whole_table and assign.world_size != sum(s.nproc for s in assign.rank_table):
            self.ctx.log.error("assign %s has an inconsistent rank table; ignored", assign.id)
            return
        if mine.node != self.spec.node:
            # The replica moved (a `node` recovery): the agent on its new node runs it;
            # this one is being removed and must not start workers that join it.
            if assign.stop is not None:
                await self._stop_generation(assign.stop)
            self.ctx.log.info(
                "ignoring assign for generation %d: replica %d now runs on %s",
                assign.generation,
                self.spec.replica,
                mine.node,
            )
            return
        # The new store starts while the old workers stop; the old one closes after.
        hosting = self._host_store(assign)
        if assign.stop is not None:  # the Stop folded into this Assign, first
            await self._stop_generation(assign.stop)
        retired, self.store = self.store, None
        try:
            await self._replace_workers(assign, hosting)
        finally:
            if retired is not None:
                self.ctx.spawn(retired.close())

    async def _replace_workers(
        self, assign: Assign, hosting: asyncio.Task[HostedStore | None] | None
    ) -> None:
        await self._await_master_name(assign)
        agent_store: bool | None = None
        if assign.level is RecoveryLevel.IN_PROCESS and self.workers is not None:
            agent_store = await self._store_ready(assign, hosting)
            failure = await self._restart_in_process(assign, agent_store)
            if failure is None:
                return
            why = f"escalated to a process restart: in-process restart failed ({failure})"
            self.ctx.log.warning("generation %d: %s", assign.generation, why)
            await self._state(AgentState.STOPPING, why)
            assign = _past_the_failed_attempt(assign, self.spec.nproc)
            if self.store is not None:
                hosting, agent_store = await self._renew_store(assign), None
        await self._stop_workers(f"generation {assign.generation} assigned")
        self.generation = assign.generation
        self.assign = assign
        if agent_store is None:
            agent_store = await self._store_ready(assign, hosting)
        running = self.running = _Running(assign, self._environments(assign, agent_store))
        self.workers = WorkerProcesses(
            self.spec.command,
            running.environments,
            cwd=self.spec.working_dir,
            on_start=lambda lr, pid: self._started(running.assign, lr, pid),
            on_line=lambda lr, stream, line: self._line(running.assign, lr, stream, line),
            on_exit=lambda exit_: self._exited(running.assign, exit_),
            echo_prefix=lambda lr: f"[{self._rank(running.assign, lr)}]:",
            spawner=self.spawner or PlainSpawner(),
        )
        await self.workers.start()
        await self._state(AgentState.RUNNING, f"generation {assign.generation} running")
        self.ctx.spawn(self._await_idle(self.workers, running))
        self.ctx.spawn(self._watch_states(self.workers, running))

    async def _renew_store(self, assign: Assign) -> asyncio.Task[HostedStore | None] | None:
        """Close the store of a failed in-process restart and host a new one on the same
        port, for the processes that replace it. Ranks that rejoined left their gloo/NCCL
        addresses in the old store, and torch's clients of an agent's store read them
        with no per-attempt prefix (torch's own agent makes a new store for every retry,
        as this does); a new rank reading a killed one's address fails to connect.
        Ranks of other replicas that rejoined lose the old store and fail fast: their
        faults go to the restarter."""
        stale, self.store = self.store, None
        if stale is not None:
            await stale.close()
        return self._host_store(assign)

    async def _restart_in_process(self, assign: Assign, agent_store: bool) -> str | None:
        """Move the running workers to ``assign``'s generation in-process; None once every
        one confirmed, else why not (the workers are then still to be stopped)."""
        workers, running = self.workers, self.running
        if workers is None or running is None or not workers.running:
            return "no workers running"
        pids = restartable_workers(self.spec.nproc, workers.pid_of, self.channel.worker)
        if isinstance(pids, str):
            return pids
        environments = self._environments(assign, agent_store)
        lines = {}
        for local_rank in pids:
            before, after = running.environments[local_rank], environments[local_rank]
            try:
                lines[local_rank] = restart_line(
                    assign.generation, after, sorted(set(before) - set(after))
                )
            except ValueError as error:
                return str(error)
        rejoins = self.rejoins = Rejoins(assign.generation, pids)
        self.generation, self.assign = assign.generation, assign
        running.assign, running.environments = assign, environments
        await self._state(
            AgentState.RUNNING, f"restarting generation {assign.generation} in-process"
        )
        try:
            for local_rank, pid in pids.items():
                if not self.channel.send(local_rank, lines[local_rank], pid=pid):
                    return f"local rank {local_rank} disconnected"
            failure = await rejoins.wait(assign.rejoin_timeout_seconds)
        finally:
            self.rejoins = None
        if failure is None:
            for local_rank, pid in pids.items():  # started again, in the same process
                await self._started(assign, local_rank, pid, in_process=True)
            await self._state(
                AgentState.RUNNING, f"generation {assign.generation} running (in-process)"
            )
        return failure

    async def _watch_states(self, workers: WorkerProcesses, running: _Running) -> None:
        """Publish ProcessStateChanged when a worker stops (state T) or runs again."""
        stopped: dict[int, bool] = {}
        while self.workers is workers and workers.running:
            for local_rank, pid in workers.running_pids().items():
                now = is_stopped(pid)
                if now is None or now == stopped.get(local_rank, False):
                    continue
                stopped[local_rank] = now
                self.ctx.log.warning(
                    "local rank %d (pid %d) %s",
                    local_rank,
                    pid,
                    "is stopped" if now else "runs again",
                )
                event = ProcessStateChanged(
                    pid=pid,
                    stopped=now,
                    since=datetime.now(UTC),
                    **self._envelope(running.assign, local_rank),
                )
                await self._publish(event)
            await asyncio.sleep(STATE_SAMPLE_SECONDS)

    async def _await_idle(self, workers: WorkerProcesses, running: _Running) -> None:
        await workers.wait()
        if self.workers is workers:
            await self._state(
                AgentState.IDLE, f"generation {running.assign.generation} workers exited"
            )

    async def _stop_command(self, stop: Stop) -> None:
        if self.generation is None and stop.final and stop.time < self.started_at:
            self.ctx.log.info("ignoring a final stop of an earlier run (%s)", stop.reason)
            return
        await self._stop_generation(stop)
        if stop.final:
            await self._state(AgentState.EXITING, stop.reason or "job over")
            self.ctx.stopping.set()

    async def _stop_generation(self, stop: Stop | StopFirst) -> None:
        """Stop the workers of ``stop.generation`` or older, as a Stop (or the Stop an
        Assign folds in) says: its hung ranks at once, the rest after its grace."""
        if self.generation is not None and self.generation > stop.generation:
            return
        hung = set()
        if self.assign is not None:
            first = self._rank(self.assign, 0)
            hung = {r - first for r in stop.hung_ranks if 0 <= r - first < self.spec.nproc}
        await self._stop_workers(
            stop.reason or f"stop generation {stop.generation}",
            grace=stop.timeout_seconds if stop.graceful else 0.0,
            kill_now=hung,
        )

    async def _stop_workers(
        self, why: str, grace: float | None = None, kill_now: set[int] | None = None
    ) -> None:
        """Stop the running workers: hung ones (``kill_now``, or stopped) at once, the
        rest after SIGTERM and ``grace`` (default: the job's stopGraceSeconds), and what
        is left of the workers that exited (children they forked)."""
        if self.workers is not None:
            self.workers.kill_leftovers()
        if self.workers is None or not self.workers.running:
            return
        if self.generation is not None:
            await self.channel.notify_stop_pending(self.generation, why)
        await self._state(AgentState.STOPPING, why)
        grace = self.spec.stop_grace_seconds if grace is None else grace
        await self.workers.stop(grace, kill_now or set())

    async def _shutdown(self) -> None:
        await self._stop_workers("agent shutting down")
        # Ended by SIGTERM (its worker group deleted: the job is over, or this replica
        # moved) as much as by a final Stop: either way the agent exits, and says so
        # before its outbox is flushed (watchers wait for every agent to exit).
        await self._state(AgentState.EXITING, "agent shutting down")
        for store in (self.store, self.standby):
            if store is not None:
                await store.close()
        self.store = self.standby = None
        if self.store_folder is not None:
            shutil.rmtree(self.store_folder, ignore_errors=True)
        # The worker group's memory goes with it, as a pod's does (its workers are gone).
        shutil.rmtree(self.checkpoint_env[SNAPSHOT_DIR], ignore_errors=True)

    def _rank(self, assign: Assign, local_rank: int) -> int:
        slot = assign.slot(self.spec.replica)
        assert slot is not None  # checked when the Assign came
        return slot.first_rank + local_rank

    def _envelope(self, assign: Assign, local_rank: int) -> dict[str, object]:
        return {
            "source": self.bus.source,
            "job": self.spec.job,
            "replica": self.spec.replica,
            "node": self.spec.node,
            "generation": assign.generation,
            "rank": self._rank(assign, local_rank),
            "local_rank": local_rank,
        }

    def _worker_envelope(self, hello: Hello) -> dict[str, object]:
        """For a worker's report: the generation and rank the worker says it is in."""
        return {
            "source": self.bus.source,
            "job": self.spec.job,
            "replica": self.spec.replica,
            "node": self.spec.node,
            "generation": hello.generation,
            "rank": hello.rank,
            "local_rank": hello.local_rank,
        }

    async def _started(
        self, assign: Assign, local_rank: int, pid: int, *, in_process: bool = False
    ) -> None:
        event = ProcessStarted(
            pid=pid,
            local_world_size=self.spec.nproc,
            in_process=in_process,
            **self._envelope(assign, local_rank),
        )
        await self._publish(event)

    async def _line(self, assign: Assign, local_rank: int, stream: Stream, line: str) -> None:
        event = LogLine(stream=stream, line=line, **self._envelope(assign, local_rank))
        await self._telemetry(event)

    async def _telemetry(self, event: Envelope) -> None:
        """Queue a log line or a progress report; a full outbox drops the oldest first,
        counted, never raised: the output pump that calls this must go on to report its
        worker's exit."""
        await self._publish(event)

    async def _exited(self, assign: Assign, exit_: WorkerExit) -> None:
        if self.rejoins is not None and self.assign is assign:
            self.rejoins.fail(f"local rank {exit_.local_rank} exited")
        event = ProcessExited(
            pid=exit_.pid,
            local_world_size=self.spec.nproc,
            exit_code=exit_.exit_code,
            signal=exit_.signal,
            expected=exit_.expected,
            last_output=list(exit_.last_output),
            **self._envelope(assign, exit_.local_rank),
        )
        await self._publish(event)

    async def _report(self, hello: Hello, report: Report) -> None:
        """A report from a worker, stamped with the generation and rank it is in."""
        if self.assign is None:
            return
        envelope = self._worker_envelope(hello)
        if isinstance(report, ProgressReport):
            event: Envelope = Progress(
                step=report.step, metrics=report.metrics, in_process=hello.in_process, **envelope
            )
            await self._telemetry(event)
        elif isinstance(report, CheckpointReport):
            # The world size of the worker's generation, so its report counts only with
            # those of its own generation (the Assign of an older one is gone).
            world = self.assign.world_size if self.assign.generation == hello.generation else None
            saved = CheckpointSaved(
                step=report.step, path=report.path, world_size=world, **envelope
            )
            await self._publish(saved)
        elif isinstance(report, FaultReport):
            envelope["generation"] = report.generation
            self.ctx.log.warning(
                "rank %d raised %s: %s", hello.rank, report.exception, report.message[:200]
            )
            event = WorkerFault(
                exception=report.exception,
                message=report.message,
                traceback=report.traceback,
                **envelope,
            )
            await self._publish(event)
        elif isinstance(report, RestoreReport):
            envelope["generation"] = report.generation
            restored = StateRestored(
                step=report.step,
                origin=report.source,
                detail=report.detail,
                sharded=report.sharded,
                reshardable=report.reshardable,
                **envelope,
            )
            await self._publish(restored)
        elif isinstance(report, Rejoining) and self.rejoins is not None:
            self.rejoins.confirm(hello.local_rank, report.generation)

    async def _state(self, state: AgentState, detail: str) -> None:
        """Say the agent's state; ``exiting`` is said once and is its last word."""
        if self._said_exiting:
            return
        self._said_exiting = state is AgentState.EXITING
        event = AgentStateChanged(
            source=self.bus.source,
            job=self.spec.job,
            replica=self.spec.replica,
            node=self.spec.node,
            generation=self.generation,
            state=state,
            detail=detail,
        )
        await self._publish(event)

    async def _publish(self, event: Envelope) -> None:
        """Queue ``event`` on its raw subject, behind what is queued; it never waits for
        the bus (the outbox sends it, see the module docstring)."""
        self.outbox.put(self.bus.subjects.raw(self.spec.job, event.kind, self.spec.node), event)


def _past_the_failed_attempt(assign: Assign, nproc: int) -> Assign:
    """The Assign the processes of a failed in-process restart are started again with.

    A process restart is one more restart: where this agent runs every rank of the
    generation, its processes get ``TORCHELASTIC_RESTART_COUNT + 1`` (torch releases
    that prefix an agent's store by ``/worker/attempt_<N>`` then meet under a prefix
    where nothing stale is; newer ones do not prefix, and the agent's new store, see
    :meth:`LaunchAgent._renew_store`, is what keeps stale addresses away). Where other
    replicas run ranks too, they are still in the Assign's attempt, so it is kept."""
    if assign.world_size != nproc:
        return assign
    return assign.model_copy(update={"restart_count": assign.restart_count + 1})
