"""The local cluster's supervisor: NATS, the services and the virtual nodes, kept running.

:class:`Supervisor` starts an embedded nats-server (unless given a URL), the three
control-plane services and one node monitor per virtual node, each as a child process
with its output in ``<state_dir>/logs/<name>.log``. It is ready once every node has
registered and every service has bound its consumers. ``restarters`` and ``scalers``
run that many replicas of those services; ``child_env`` gives a child (by name:
``detector``, ``scaler-2``, ``node-0``) variables of its own over the common ones, as a
NATS URL of its own (a bench puts a proxy between each service and NATS).

The nodes are the ones ``nodes.json`` in the state folder wants
(:mod:`resurge.local.node_set`): ``nodes`` fresh ones (``node-0`` upwards, with
``gpus_per_node`` GPUs), or, with ``keep_nodes`` and a file from an earlier run, that
file's nodes (added ones and their labels included). :meth:`Supervisor.check`
reconciles against the file: a node ``resurge node add`` wrote gets a monitor, and a
node ``resurge node remove`` took out has its monitor stopped (SIGTERM; SIGKILL after
``grace`` seconds) and then its record forgotten by the backend, so nobody lists it or
counts it as lost. A node the file marks ``down`` (``resurge inject node-down``) loses
power: its monitor and every process below it are SIGKILLed, and nothing of it starts
again, whatever restarts the supervisor goes through, until the file marks it up
(``resurge node up``); its record stays, so the cluster sees the node go silent. At
start, records of nodes the file does not want (left by an earlier run) are forgotten
too. Before any service starts, the
jobs of an earlier run of the cluster go back to Pending (:mod:`resurge.local.restore`),
to resume from their checkpoints. Like a Deployment, it starts
again any child that dies, and says so in its log; so too the embedded nats-server
(on the same port, with the same JetStream data folder, so streams, consumers and
job records are as it left them, and every client reconnects by itself). ``python -m
resurge.local.supervisor`` is what ``resurge up`` runs in the background.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats.errors
import nats.js.errors

from resurge.access.server_config import tls_block
from resurge.cluster import open_backend
from resurge.cluster.local.backend import LocalBackend
from resurge.contract.subjects import Subjects
from resurge.contract.subscriptions import DETECTOR_RAW, RESTARTER_FAULTS, SCALER_JOBS, Scope
from resurge.local.access import LocalAccess
from resurge.local.job_users import PlacementWatch
from resurge.local.nats_server import NatsServer, cluster_of
from resurge.local.node_set import NodeEntry, NodeSet, editing, plan
from resurge.local.restore import restore
from resurge.local.state import ClusterState, StateLock
from resurge.runtime.bus import Bus
from resurge.runtime.logs import configure_logging
from resurge.runtime.nats_auth import JOB_CREDENTIALS_DIR
from resurge.runtime.settings import Settings
from resurge.worker.snapshot_folder import node_memory

__all__ = ["Supervisor"]

log = logging.getLogger("resurge.supervisor")

SERVICES = {
    "detector": ["-m", "resurge_detector"],
    "restarter": ["-m", "resurge_restarter"],
    "scaler": ["-m", "resurge_scaler"],
}
# Durable consumers each service binds once it is ready: (stream name, consumer).
READY_CONSUMERS = [
    (entry.stream, entry.consumer(Scope(group="detector")))
    for entry in (DETECTOR_RAW, RESTARTER_FAULTS, SCALER_JOBS)
]
_MAX_BACKOFF_SECONDS = 10.0
# A removed node's monitor stops its worker groups first: SIGKILL only after this long.
_NODE_STOP_GRACE_SECONDS = 30.0


@dataclass
class _Child:
    name: str
    argv: list[str]
    role: str = "agent"  # its NATS user's role (a node monitor: its node's agent user)
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    node: NodeEntry | None = None  # a node monitor's node, as it was started
    stop_by: float | None = None  # being stopped for good: SIGKILL at this time
    failed: bool = False  # its machine "died" (fail_node): nothing starts it again


@dataclass
class Supervisor:
    """The local cluster's processes (NATS, services, node monitors) and how to reach them."""

    state_dir: Path
    nodes: int = 2
    gpus_per_node: int = 2
    namespace: str = "resurge"
    nats_url: str | None = None
    nats_port: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    restarters: int = 1
    scalers: int = 1
    child_env: dict[str, dict[str, str]] = field(default_factory=dict)  # child name -> its own
    keep_nodes: bool = False
    children: dict[str, _Child] = field(default_factory=dict)
    server: NatsServer | None = None
    nats_servers: int = 1  # more than 1: a NATS cluster on loopback, streams replicated
    peers: list[NatsServer] = field(default_factory=list)  # the cluster's other servers
    node_set: NodeSet | None = None
    access: LocalAccess | None = None  # the NATS users, when this supervisor runs NATS
    tls_ca: Path | None = None  # the CA clients verify the embedded server with
    server_restarts: int = 0  # times the embedded server was started again
    _forget: set[str] = field(default_factory=set)
    _server_next_start: dict[int, float] = field(default_factory=dict)
    _stopping: bool = False
    _powering: threading.Lock = field(default_factory=threading.Lock)
    _placements: PlacementWatch | None = None  # where launch agents need users of their own

    @property
    def node_names(self) -> list[str]:
        """The virtual nodes' names as the node set wants them (``node-0`` upwards
        before :meth:`start`)."""
        if self.node_set is None:
            return [f"node-{i}" for i in range(self.nodes)]
        return self.node_set.names

    @property
    def down_nodes(self) -> list[str]:
        """The nodes powered off now: no process of them runs, none is started."""
        return [c.name for c in self.children.values() if c.node is not None and c.failed]

    @property
    def log_dir(self) -> Path:
        """Where each child's log goes."""
        return self.state_dir / "logs"

    def env(self) -> dict[str, str]:
        """The environment every child starts with, pointing it at this cluster."""
        # Workers that run `python ...` get the interpreter this cluster runs on.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        assert self.nats_url is not None
        return {
            **os.environ,
            "PATH": path,
            "RESURGE_NATS_URL": self.nats_url,
            "RESURGE_NAMESPACE": self.namespace,
            "RESURGE_STATE_DIR": str(self.state_dir),
            "PYTHONUNBUFFERED": "1",
            # Readable logs in the state folder; RESURGE_LOG_FORMAT=json for a shipper.
            "RESURGE_LOG_FORMAT": os.environ.get("RESURGE_LOG_FORMAT", "text"),
            "RESURGE_STREAM_REPLICAS": str(self.stream_replicas),
            **self.extra_env,
        }

    def credentials(self, role: str, node: str | None = None) -> dict[str, str]:
        """The variables that connect a party of ``role`` (an agent: ``node``'s) with
        its own NATS user and this cluster's TLS; none where NATS runs without users."""
        env = {"RESURGE_NATS_TLS_CA": str(self.tls_ca)} if self.tls_ca else {}
        if self.access is not None:
            env["RESURGE_NATS_CREDENTIALS"] = str(self.access.path(role, node))
            if role == "agent":  # where its launch agents' users of their job appear
                env[JOB_CREDENTIALS_DIR] = str(self.access.folder)
        return env

    def settings(self, role: str = "admin") -> Settings:
        """Settings that reach this cluster's NATS as ``role`` (the supervisor: admin)."""
        assert self.nats_url is not None
        given = self.credentials(role)
        return Settings(
            nats_url=self.nats_url,
            namespace=self.namespace,
            nats_credentials=given.get("RESURGE_NATS_CREDENTIALS"),
            nats_tls_ca=given.get("RESURGE_NATS_TLS_CA", self.tls_ca),
            stream_replicas=self.stream_replicas,
        )

    @property
    def stream_replicas(self) -> int:
        """Copies of each stream and bucket: one per server, up to 3 (NATS's own advice)."""
        return min(self.nats_servers, 3)

    @property
    def servers(self) -> list[NatsServer]:
        """Every embedded nats-server (none when given a URL)."""
        return [] if self.server is None else [self.server, *self.peers]

    def _start_server(self) -> None:
        """The embedded NATS server with a user per role and node (and TLS where
        RESURGE_NATS_TLS_CERT and _KEY are set): no anonymous connection gets on."""
        assert self.node_set is not None
        self.access = LocalAccess(self.state_dir, Subjects(self.namespace))
        self.access.prepare(self.node_set.names)
        tls = ""
        ours = Settings()
        if ours.nats_tls_cert is not None and ours.nats_tls_key is not None:
            tls = tls_block(ours.nats_tls_cert, ours.nats_tls_key, None)
            self.tls_ca = ours.nats_tls_ca
        config = self.access.write_config(self.node_set.names, tls)
        scheme = "tls" if tls else "nats"
        if self.nats_servers > 1:
            first, *self.peers = cluster_of(
                self.state_dir / "nats", self.nats_servers, config, scheme
            )
            self.server = first
            for server in self.servers:
                server.start()
            self.nats_url = ",".join(server.url for server in self.servers)
            return
        server = NatsServer(self.state_dir / "nats", self.nats_port, config=config, scheme=scheme)
        self.server = server.start()
        self.nats_url = self.server.url

    def start(self, timeout: float = 60.0) -> None:
        """Start everything and return once it is ready."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        earlier = NodeSet.load(self.state_dir)
        self.node_set = earlier if self.keep_nodes else None
        if self.node_set is None:
            self.node_set = NodeSet.fresh(self.nodes, self.gpus_per_node)
            if earlier is not None:  # names once used stay used
                self.node_set.next_index = max(self.nodes, earlier.next_index)
            self.node_set.save(self.state_dir)
        self.gpus_per_node = self.node_set.gpus_per_node
        if self.nats_url is None:
            self._start_server()
        asyncio.run(self._restore())
        if self.access is not None:
            self._placements = PlacementWatch(self.settings())
            self._placements.start()
        self.children.update(self._services())
        for node in self.node_set.nodes:
            self.children[node.name] = self._monitor(node)
        for child in self.children.values():
            if not child.failed:
                self._spawn(child)
        asyncio.run(self._wait_ready(timeout))

    def _services(self) -> dict[str, _Child]:
        """The services' children, not yet started: one of each, and ``restarters`` and
        ``scalers`` replicas in all (``restarter-2``, ``scaler-2``, ...: replicas share
        their service's consumers, as in the production overlay)."""
        python = sys.executable
        children = {name: _Child(name, [python, *a], role=name) for name, a in SERVICES.items()}
        for role, count in (("restarter", self.restarters), ("scaler", self.scalers)):
            for extra in range(2, count + 1):
                name = f"{role}-{extra}"
                children[name] = _Child(name, [python, *SERVICES[role]], role=role)
        return children

    def _monitor(self, node: NodeEntry) -> _Child:
        """A node's monitor, not yet started (and never, while the node is down)."""
        argv = [sys.executable, "-m", "resurge_node_agent", *node.monitor_args(self.log_dir)]
        return _Child(node.name, argv, node=node, failed=node.down)

    def _spawn(self, child: _Child) -> None:
        with (self.log_dir / f"{child.name}.log").open("ab") as out:
            child.process = subprocess.Popen(
                child.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={
                    **self.env(),
                    **self.credentials(child.role, child.name),
                    **self.child_env.get(child.name, {}),
                },
                cwd=self.cwd,
                start_new_session=True,
            )

    async def _restore(self) -> None:
        """Before any service runs: jobs of an earlier run go back to Pending, and the
        records of nodes no longer wanted are forgotten."""
        bus = await Bus.connect(self.settings(), "supervisor")
        try:
            await bus.ensure_streams()
            await restore(bus)
            backend = await LocalBackend.open(bus)
            for node in await backend.list_nodes():
                if node.name not in self.node_names:
                    await backend.forget_node(node.name)
                    log.info("forgot %s, a node of an earlier run no longer wanted", node.name)
        finally:
            await bus.close()

    async def _forget_nodes(self, names: set[str]) -> None:
        bus = await Bus.connect(self.settings(), "supervisor")
        try:
            backend = await LocalBackend.open(bus)
            for name in sorted(names):
                await backend.forget_node(name)
        finally:
            await bus.close()

    async def _wait_ready(self, wait_seconds: float) -> None:
        settings = self.settings()
        bus = await Bus.connect(settings, "supervisor")
        try:
            await bus.ensure_streams()
            backend = await open_backend(bus, settings)
            deadline = time.monotonic() + wait_seconds
            powered = set(self.node_names) - set(self.down_nodes)
            while True:
                nodes = {n.name for n in await backend.live_nodes()}
                bound = [await _has_consumer(bus, stream, name) for stream, name in READY_CONSUMERS]
                if powered <= nodes and all(bound):
                    return
                dead = [
                    c.name
                    for c in self.children.values()
                    if c.process and c.process.poll() is not None
                ]
                if dead or time.monotonic() > deadline:
                    why = f"exited: {', '.join(dead)}" if dead else "timed out"
                    raise RuntimeError(f"local cluster not ready ({why}); see {self.log_dir}")
                await asyncio.sleep(0.1)  # readiness of other processes: polled, bounded
        finally:
            await bus.close()

    def alive(self) -> dict[str, bool]:
        """Child name -> whether its process is running now."""
        return {
            name: c.process is not None and c.process.poll() is None
            for name, c in self.children.items()
        }

    def check(self) -> bool:
        """Reconcile the node monitors with ``nodes.json``, and start again any child
        that died (with backoff), and log it. True when the nodes run changed. Once
        :meth:`stop` began, nothing is started again."""
        if self._stopping:
            return False
        self._check_server()
        self._add_job_users()
        changed = self._reconcile_nodes()
        now = time.monotonic()
        for child in self.children.values():
            if child.stop_by is not None or child.failed:
                continue
            if child.process is None or child.process.poll() is None:
                continue
            if child.next_start == 0.0:
                child.restarts += 1
                delay = min(_MAX_BACKOFF_SECONDS, 0.5 * 2 ** min(child.restarts - 1, 5))
                child.next_start = now + delay
                log.warning(
                    "%s exited with code %s; starting it again in %.1f s (restart %d)",
                    child.name,
                    child.process.returncode,
                    delay,
                    child.restarts,
                )
            elif now >= child.next_start:
                child.next_start = 0.0
                self._spawn(child)
                log.warning("%s started again (pid %d)", child.name, child.process.pid)
        return changed

    def _check_server(self) -> None:
        """Start every embedded nats-server that died again (with the children's
        backoff), on its port and data folder, and log it."""
        for index, server in enumerate(self.servers):
            if server.process is not None and server.process.poll() is not None:
                self._restart_server(index, server)

    def _restart_server(self, index: int, server: NatsServer) -> None:
        assert server.process is not None
        now = time.monotonic()
        next_start = self._server_next_start.get(index, 0.0)
        if next_start == 0.0:
            self.server_restarts += 1
            delay = min(_MAX_BACKOFF_SECONDS, 0.5 * 2 ** min(self.server_restarts - 1, 5))
            self._server_next_start[index] = now + delay
            log.warning(
                "nats-server exited with code %s; starting it again on port %d in %.1f s "
                "(restart %d)",
                server.process.returncode,
                server.port,
                delay,
                self.server_restarts,
            )
            return
        if now < next_start:
            return
        try:
            server.start()
        except (RuntimeError, TimeoutError, OSError) as error:
            self._server_next_start[index] = 0.0  # another restart, with more backoff
            log.warning("nats-server did not start again: %s", error)
            return
        self._server_next_start[index] = 0.0
        log.warning(
            "nats-server started again (pid %d) at %s with its data in %s",
            server.process.pid,
            server.url,
            server.state_dir,
        )

    def fail_node(self, name: str) -> list[int]:
        """Node ``name``'s machine dies, for tests and demos: ``nodes.json`` marks it down
        (as ``resurge inject node-down`` does) and its monitor and every process below it
        (worker groups' agents, fork servers, workers) are SIGKILLed at once; nothing of it
        starts again until the set marks it up. Its record stays, so the cluster sees the
        node go silent. The pids killed."""
        with self._powering:  # not seen half done by a check in another thread
            with editing(self.state_dir) as node_set:
                node_set.power(name, on=False)
            return self._power_off(name)

    def _power_off(self, name: str) -> list[int]:
        """SIGKILL node ``name``'s monitor and every process below it; start none again."""
        child = self.children[name]
        if child.node is None:
            raise ValueError(f"{name} is not a node")
        child.failed = True
        killed = []
        if child.process is not None and child.process.poll() is None:
            for pid in [child.process.pid, *_descendants(child.process.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            child.process.wait()
        shutil.rmtree(node_memory(name, self.state_dir), ignore_errors=True)  # power lost
        log.warning("%s failed on purpose: %d process(es) killed", name, len(killed))
        return killed

    def _reconcile_nodes(self) -> bool:
        """One step towards the wanted nodes; True when a monitor started or went."""
        wanted = NodeSet.load(self.state_dir)
        if wanted is None or self.node_set is None:
            return False
        self.node_set = wanted
        running = {c.name: c.node for c in self.children.values() if c.node is not None}
        steps = plan(wanted.nodes, running)
        gone = [name for name in steps.stop if self._stop_node(self.children[name])]
        for name in gone:
            del self.children[name]
            self._forget.add(name)
        if self._forget:
            self._forget_stopped()
        started = [node for node in steps.start if node.name not in self._forget]
        self._add_users([node.name for node in started])
        for node in started:  # a node whose old record is not yet forgotten waits for it
            child = self.children[node.name] = self._monitor(node)
            if child.failed:
                continue
            self._spawn(child)
            assert child.process is not None
            log.info("started %s (pid %d): %d GPU(s)", node.name, child.process.pid, node.gpus)
        powered = self._power()
        return bool(gone or started or powered)

    def _power(self) -> bool:
        """Power off each running node the set marks down, and on each down node it marks
        up; True when one was. The set is read under the lock :meth:`fail_node` holds."""
        changed = False
        with self._powering:
            wanted = NodeSet.load(self.state_dir)
            for node in [] if wanted is None else wanted.nodes:
                changed |= self._power_one(node)
        return changed

    def _power_one(self, node: NodeEntry) -> bool:
        """Power ``node`` off or on as the set wants it; True when it was."""
        child = self.children.get(node.name)
        if child is None or child.node is None or child.stop_by is not None:
            return False
        if node.down and not child.failed:
            self._power_off(node.name)
            return True
        if not node.down and child.failed:
            child.failed, child.restarts, child.next_start = False, 0, 0.0
            self._spawn(child)
            assert child.process is not None
            log.warning("%s powered on (pid %d)", node.name, child.process.pid)
            return True
        return False

    def _add_users(self, nodes: list[str]) -> None:
        """Give each of ``nodes`` that has none its agent user, and have the server
        take the new users in (a config reload) before their monitors start."""
        if self.access is None or self.server is None or self.node_set is None:
            return
        new = [node for node in nodes if self.access.add_node(node)]
        if not new:
            return
        self.access.write_config(self.node_set.names, self._tls_config())
        for server in self.servers:
            server.reload()
        asyncio.run(self._wait_user(new[-1]))
        log.info("NATS users added for %s", ", ".join(new))

    def _add_job_users(self) -> None:
        """Give each (node, job) newly placed a user of its own for its launch agents:
        the server takes it in (a config reload) before its credentials file appears,
        which the node's monitor waits for (:mod:`resurge.local.job_users`)."""
        if self._placements is None or self.access is None or self.node_set is None:
            return
        pairs = self._placements.new()
        new = [pair for pair in pairs if self.access.add_job_agent(*pair)]
        try:
            if new:
                self.access.write_config(self.node_set.names, self._tls_config())
                for server in self.servers:
                    server.reload()
                for node, job in new:
                    asyncio.run(self._wait_user(node, job=job))
                log.info("NATS users added for %s", ", ".join(f"{j} on {n}" for n, j in new))
        finally:  # placements are handed out once: a failed wait still leaves the files
            for node, job in pairs:
                self.access.job_agent_ready(node, job)

    def _tls_config(self) -> str:
        ours = Settings()
        if self.tls_ca is None and (ours.nats_tls_cert is None or ours.nats_tls_key is None):
            return ""
        assert ours.nats_tls_cert is not None and ours.nats_tls_key is not None
        return tls_block(ours.nats_tls_cert, ours.nats_tls_key, None)

    async def _wait_user(
        self, node: str, wait_seconds: float = 10.0, job: str | None = None
    ) -> None:
        """Return once ``node``'s agent user (``job``'s on it, if given) may connect (the
        reload took), or after ``wait_seconds`` (its agent then retries as any client
        would)."""
        path = None
        if self.access is not None:
            path = self.access.path("agent", node)
            if job is not None:
                path = self.access.job_agent_file(node, job)
        settings = self.settings("agent").model_copy(update={"nats_credentials": path})
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            try:
                bus = await Bus.connect(settings, "supervisor", connect_timeout=1.0)
            except ConnectionError:
                await asyncio.sleep(0.05)  # another process's config reload: polled, bounded
                continue
            await bus.close()
            return
        log.warning("the NATS user of %s was not accepted within %g s", node, wait_seconds)

    def _stop_node(self, child: _Child) -> bool:
        """One step of stopping a node's monitor for good; True once it has exited."""
        now = time.monotonic()
        running = child.process is not None and child.process.poll() is None
        if child.stop_by is None:
            child.stop_by = now + _NODE_STOP_GRACE_SECONDS
            log.info("stopping %s: it is no longer wanted", child.name)
            if running and child.process is not None:
                os.killpg(child.process.pid, signal.SIGTERM)
        if not running:
            return True
        if now > child.stop_by and child.process is not None:
            log.warning("%s did not stop in time; killing it", child.name)
            os.killpg(child.process.pid, signal.SIGKILL)
        return False

    def _forget_stopped(self) -> None:
        """Forget the records of the nodes whose monitors stopped (else at the next check)."""
        try:
            asyncio.run(self._forget_nodes(self._forget))
        except Exception as error:
            log.warning("could not forget nodes %s yet: %s", sorted(self._forget), error)
        else:
            log.info("removed %s", ", ".join(sorted(self._forget)))
            self._forget.clear()

    def stop(self, grace: float = 20.0) -> None:
        """Stop the nodes first (they stop their workers), then the services, then NATS;
        a :meth:`check` running meanwhile (another thread's) starts nothing again."""
        self._stopping = True
        if self._placements is not None:
            self._placements.stop()
        nodes = [c for c in self.children.values() if c.node is not None]
        services = [c for c in self.children.values() if c.node is None]
        for group in (nodes, services):
            for child in group:
                if child.process and child.process.poll() is None:
                    os.killpg(child.process.pid, signal.SIGTERM)
            for child in group:
                if child.process is None:
                    continue
                try:
                    child.process.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    os.killpg(child.process.pid, signal.SIGKILL)
                    child.process.wait()
        for server in self.servers:
            server.stop()
        shutil.rmtree(node_memory("-", self.state_dir).parent, ignore_errors=True)

    def state(self) -> ClusterState:
        """The record ``cluster.json`` keeps for this running cluster."""
        assert self.nats_url is not None
        return ClusterState(
            nats_url=self.nats_url,
            namespace=self.namespace,
            pid=os.getpid(),
            nodes=self.node_names,
            gpus_per_node=self.gpus_per_node,
            tls_ca=str(self.tls_ca) if self.tls_ca else None,
            down=self.down_nodes,
        )


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, those in sessions of their own too (read from
    ``/proc``; none where there is no ``/proc``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


async def _has_consumer(bus: Bus, stream: str, name: str) -> bool:
    """Whether the consumer exists; a request that times out or finds JetStream not
    ready answers no (a cluster's new consumer may still be electing its leader)."""
    try:
        await bus.js.consumer_info(bus.subjects.stream(stream), name)
    except (
        nats.js.errors.NotFoundError,
        nats.js.errors.ServiceUnavailableError,
        nats.errors.TimeoutError,
    ):
        return False
    return True


def _checked(supervisor: Supervisor) -> bool:
    """:meth:`Supervisor.check`, whose failure is logged and tried again at the next
    check (a NATS server that stopped answering for a moment, say): the supervisor, and
    with it the record that commands find the cluster by, stays."""
    try:
        return supervisor.check()
    except Exception:
        log.exception("a check of the local cluster failed; trying again")
        return True  # what changed before it failed is recorded


def serve(supervisor: Supervisor, ready_fd: int | None) -> int:
    """Run until SIGTERM/SIGINT: start, report ready, keep children alive, stop."""
    lock = StateLock(supervisor.state_dir)
    if not lock.acquire():
        log.error("another supervisor holds %s", lock.path)
        return 1
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        try:
            supervisor.start()
        except Exception as error:
            log.error("%s", error)
            supervisor.stop(grace=5)
            return 1
        supervisor.state().save(supervisor.state_dir)
        log.info(
            "local cluster ready: nats at %s, nodes %s",
            supervisor.nats_url,
            ", ".join(supervisor.node_names),
        )
        if ready_fd is not None:
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)
        while not stopping:
            if _checked(supervisor):
                supervisor.state().save(supervisor.state_dir)
            time.sleep(0.2)
        log.info("stopping the local cluster")
        supervisor.stop()
        return 0
    finally:
        ClusterState.path(supervisor.state_dir).unlink(missing_ok=True)
        lock.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the local cluster (used by `resurge up`).")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=2)
    parser.add_argument("--namespace", default="resurge")
    parser.add_argument("--port", type=int, default=0, help="NATS port (default: a free one)")
    parser.add_argument(
        "--nats-cluster", type=int, default=1, help="NATS servers (more than 1: a cluster)"
    )
    parser.add_argument("--ready-fd", type=int, default=None)
    parser.add_argument(
        "--keep-nodes",
        action="store_true",
        help="run the nodes nodes.json of an earlier run wants, when there is one",
    )
    args = parser.parse_args(argv)
    configure_logging("supervisor", fmt="text")
    supervisor = Supervisor(
        state_dir=args.state_dir,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        namespace=args.namespace,
        nats_port=args.port,
        keep_nodes=args.keep_nodes,
        nats_servers=args.nats_cluster,
    )
    return serve(supervisor, args.ready_fd)


if __name__ == "__main__":
    sys.exit(main())
