"""resurge's control plane on the Kubernetes backend, without a cluster, for end-to-end tests.

:class:`ControlPlane` runs the real services as processes (``resurge-detector``,
``resurge-restarter``, ``resurge-scaler``; the scaler runs the Kubernetes controller,
and with ``scalers`` > 1 the one holding the Lease does)
against a real nats-server and the API emulator (``conftest.KubeApi``), plus, per fake
node, a Node object (``add_node``) and a real ``resurge-node-agent monitor --node N
--gpus G``. The only stand-ins are the emulator and the process kubelet
(:mod:`tests.kubernetes.kubelet`), which runs the pods the controller creates. Each
service's output goes to ``<root>/logs/<name>.log``, each pod's to ``<root>/pods``.

With ``identities`` (:class:`resurge.access.server_config.NatsIdentities`), the
nats-server at ``nats_url`` runs in operator mode (:func:`operator_nats`) and every party
is a user JWT of its role: each service its role's, each monitor its node's agent user,
the tests and the CLI ``admin``; the scaler holds the account's signing key, so its
controller gives every pod a user of its own (docs/security.md), and the kubelet's pods
get no user but the one their Secret holds.

Readiness is awaited, not slept on: every service's durable consumer bound on the bus,
the controller's watches open on the emulator, and every node's monitor report on its
Node. :func:`eventually` is the bounded poll the tests wait with.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats.js.errors

from resurge.access.server_config import NatsIdentities, nats_identities
from resurge.cluster.kubernetes.objects import monitor_report
from resurge.local.nats_server import NatsServer
from resurge.local.supervisor import READY_CONSUMERS
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.kubelet import ProcessKubelet, process_environment

__all__ = ["ControlPlane", "eventually", "eventually_async"]

T = TypeVar("T")

BIN = Path(sys.executable).parent
SERVICES = ("detector", "restarter", "scaler")
_POLL_SECONDS = 0.1
_STOP_GRACE_SECONDS = 10.0


def eventually(check: Callable[[], T | None], seconds: float, what: str | Callable[[], str]) -> T:
    """Poll ``check()`` until it returns something truthy (returned) or ``seconds``
    pass (AssertionError naming ``what``, a string or a function giving one); a check
    says "not yet" with None (or another falsy value)."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what() if callable(what) else what}")
        time.sleep(_POLL_SECONDS)  # the state polled lives in other processes


async def eventually_async(
    check: Callable[[], T | None], seconds: float, what: str | Callable[[], str]
) -> T:
    """:func:`eventually` from a test's event loop (the check runs in a thread)."""
    deadline = time.monotonic() + seconds
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what() if callable(what) else what}")
        await asyncio.sleep(_POLL_SECONDS)  # the state polled lives in other processes


@dataclass
class ControlPlane:
    """The services, the fake nodes' monitors and the process kubelet (module docstring)."""

    api: KubeApi
    nats_url: str
    root: Path
    namespace: str = field(default_factory=lambda: f"k{uuid.uuid4().hex[:10]}")
    gpus: dict[str, int] = field(default_factory=dict)  # node -> GPUs, as added
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    kubelet: ProcessKubelet | None = None
    scalers: int = 1  # the first is "scaler", the others "scaler-2", ... (one leads)
    extra_env: dict[str, str] = field(default_factory=dict)  # more settings, for all
    identities: NatsIdentities | None = None  # operator-mode NATS (module docstring)
    _creds: dict[tuple[str, str | None], str] = field(default_factory=dict)

    def creds(self, role: str, node: str | None = None) -> str:
        """The ``.creds`` text of this plane's user of ``role`` (an agent: of ``node``)."""
        assert self.identities is not None, "a plane without operator-mode NATS has no users"
        if (role, node) not in self._creds:
            subjects = Settings(namespace=self.namespace).subjects
            self._creds[role, node] = self.identities.issuer.creds(role, subjects, node=node)
        return self._creds[role, node]

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def pod_dir(self) -> Path:
        return self.root / "pods"

    @property
    def settings(self) -> Settings:
        if self.identities is not None:
            admin = self.creds("admin")
            return Settings(nats_url=self.nats_url, namespace=self.namespace, nats_creds=admin)
        return Settings(nats_url=self.nats_url, namespace=self.namespace)

    def env(self) -> dict[str, str]:
        """The environment of every service, monitor and CLI call (and, through the
        kubelet, of every pod, whose own env then points it at the same bus)."""
        return process_environment(
            {
                **self.api.env,
                "RESURGE_NATS_URL": self.nats_url,
                "RESURGE_NAMESPACE": self.namespace,
                "RESURGE_CLUSTER": "kubernetes",
                "RESURGE_KUBE_NAMESPACE": "default",
                "RESURGE_LOG_LEVEL": "INFO",
                "RESURGE_LOG_FORMAT": "text",
                **self.extra_env,
                **({"RESURGE_NATS_CREDS": self.creds("admin")} if self.identities else {}),
            }
        )

    def role_env(self, name: str) -> dict[str, str]:
        """What service or monitor ``name`` adds to :meth:`env`: its own NATS user, and
        the scaler the account's signing key."""
        if self.identities is None:
            return {}
        if name.startswith("monitor-"):
            return {"RESURGE_NATS_CREDS": self.creds("agent", name.removeprefix("monitor-"))}
        role = name.split("-")[0]
        env = {"RESURGE_NATS_CREDS": self.creds(role)}
        if role == "scaler":
            env["RESURGE_KUBE_NATS_ACCOUNT"] = self.identities.account.public
            env["RESURGE_KUBE_NATS_SIGNER"] = self.identities.signing_key.seed
        return env

    # -- life cycle -----------------------------------------------------------------------

    def start(self, nodes: dict[str, int], timeout: float = 90.0) -> ControlPlane:
        """Start the kubelet, the services and one monitor per node (name -> GPUs); return
        once everything is ready (see the module docstring)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # A pod's only NATS user is the one its Secret holds.
        pod_env = {k: v for k, v in self.env().items() if k != "RESURGE_NATS_CREDS"}
        self.kubelet = ProcessKubelet(self.api.kubeconfig, pod_env, self.pod_dir)
        self.kubelet.start()
        for name in SERVICES:
            self._spawn(name, [str(BIN / f"resurge-{name}")])
        for n in range(2, self.scalers + 1):
            self._spawn(f"scaler-{n}", [str(BIN / "resurge-scaler")])
        if self.identities is not None:
            # An agent's user may not create the buckets the services make (a DaemonSet's
            # monitor started first fails and is started again); here, they come first.
            asyncio.run(self._consumers_bound(timeout))
        for node, gpus in nodes.items():
            self.add_node(node, gpus, wait=False)
        self.wait_ready(timeout)
        return self

    def add_node(
        self,
        node: str,
        gpus: int = 2,
        wait: bool = True,
        timeout: float = 60,
        simulate: bool = True,
    ) -> None:
        """A fake node: its Node (as its kubelet would register it), the process kubelet
        serving it, and its resurge monitor, simulating ``gpus`` GPUs (``--gpus``) or,
        without ``simulate``, run as the DaemonSet runs it (no ``--gpus``: this machine
        has no NVML, so it watches no GPU); with ``wait``, return once the monitor has
        reported it."""
        self.api.add_node(node, gpus=gpus)
        assert self.kubelet is not None
        self.kubelet.serve(node)
        self.gpus[node] = gpus
        argv = [str(BIN / "resurge-node-agent"), "monitor", "--node", node]
        if simulate:
            argv += ["--gpus", str(gpus)]
        self._spawn(f"monitor-{node}", argv)
        if wait:
            eventually(lambda: self.reported(node), timeout, self._why(f"{node} reported"))

    def _spawn(self, name: str, argv: list[str]) -> None:
        with (self.log_dir / f"{name}.log").open("ab") as out:
            self.processes[name] = subprocess.Popen(
                argv,
                env={
                    **self.env(),
                    **self.role_env(name),
                    "HOSTNAME": name,
                },  # a pod's hostname is its name
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.root,
            )

    def reported(self, node: str) -> bool:
        """Whether ``node``'s monitor has reported it (healthy) on its Node."""
        report = monitor_report(self.api.get("nodes", node))
        return report is not None and report.healthy

    def dead(self) -> list[str]:
        """The services and monitors that exited."""
        return [name for name, p in self.processes.items() if p.poll() is not None]

    def kill(self, name: str) -> None:
        """SIGKILL service ``name`` (``scaler``, ``scaler-2``, ...) with its process
        group, as a node losing it would; return once it is gone."""
        process = self.processes[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def restart(self, name: str) -> None:
        """Start service ``name`` again after :meth:`kill`, as its Deployment would."""
        assert self.processes[name].poll() is not None, f"{name} still runs"
        self._spawn(name, [str(BIN / f"resurge-{name.split('-')[0]}")])

    def _why(self, what: str) -> Callable[[], str]:
        def why() -> str:
            dead = self.dead()
            return f"{what}; exited: {dead or 'none'}; logs in {self.log_dir}"

        return why

    def wait_ready(self, timeout: float) -> None:
        """Every consumer bound, the controller's watches open, every node reported."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        asyncio.run(self._consumers_bound(left()))
        eventually(
            lambda: (
                self.api.watch_count("trainingjobs") >= 1 and self.api.watch_count("pods") >= 2
            ),  # the controller's and the kubelet's
            left(),
            self._why("the controller watching TrainingJobs and pods"),
        )
        for node in self.gpus:
            eventually(lambda n=node: self.reported(n), left(), self._why(f"{node} reported"))  # type: ignore[misc]

    async def _consumers_bound(self, seconds: float) -> None:
        bus = await Bus.connect(self.settings, "e2e-ready")
        try:
            deadline = time.monotonic() + seconds
            for stream, name in READY_CONSUMERS:
                while not await _has_consumer(bus, stream, name):
                    if self.dead() or time.monotonic() > deadline:
                        raise AssertionError(self._why(f"{name} bound on {stream}")())
                    await asyncio.sleep(_POLL_SECONDS)  # another process binds it
        finally:
            await bus.close()

    @contextlib.contextmanager
    def running(self, nodes: dict[str, int]) -> Iterator[ControlPlane]:
        """Started with ``nodes`` (:meth:`start`) for the block, stopped after it; a block
        that ended normally is then checked to have left no pod process behind and to
        have run into no kubelet error."""
        try:
            yield self.start(nodes)
        finally:
            self.stop()
        assert self.kubelet is not None
        assert not self.kubelet.all_pids(), "pod processes outlived the kubelet"
        assert not self.kubelet.errors, f"the kubelet ran into: {self.kubelet.errors}"

    def stop(self) -> None:
        """Stop the kubelet's pods, then every service and monitor (SIGTERM; SIGKILL after
        a grace); nothing started here is left."""
        if self.kubelet is not None:
            self.kubelet.close()
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    # -- the user's side ------------------------------------------------------------------

    def cli(self, *argv: str, timeout: float = 60) -> str:
        """Run ``resurge ARGV...`` against this control plane; its stdout (it must exit 0)."""
        done = subprocess.run(
            [str(BIN / "resurge"), *argv],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"resurge {' '.join(argv)}: {done.stdout}{done.stderr}"
        return done.stdout

    def log(self, name: str) -> str:
        """A service's or monitor's output so far."""
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def pods(self, job: str) -> list[dict[str, Any]]:
        """The job's pods in the emulator now."""
        return [
            pod
            for pod in self.api.objects("pods", "default")
            if (pod["metadata"].get("labels") or {}).get("resurge.dev/job") == job
        ]

    def training_job(self, job: str) -> dict[str, Any]:
        return self.api.get("trainingjobs", job)

    def events_of(self, job: str) -> list[dict[str, Any]]:
        """The Kubernetes Events recorded on TrainingJob ``job``."""
        return [
            e
            for e in self.api.objects("events", "default")
            if (e.get("involvedObject") or {}).get("kind") == "TrainingJob"
            and e["involvedObject"].get("name") == job
        ]


async def _has_consumer(bus: Bus, stream: str, name: str) -> bool:
    try:
        await bus.js.consumer_info(bus.subjects.stream(stream), name)
    except nats.js.errors.NotFoundError:
        return False
    return True


@contextlib.contextmanager
def operator_nats(root: Path) -> Iterator[tuple[str, NatsIdentities]]:
    """A nats-server with JetStream in operator mode, trusting a new install's operator
    and account (its URL, and the identities that sign its users)."""
    identities = nats_identities(Settings().subjects)
    root.mkdir(parents=True, exist_ok=True)
    config = root / "nats.conf"
    config.write_text(identities.server_config())
    with NatsServer(root / "nats", config=config) as server:
        yield server.url, identities
