"""A Kubernetes API server for tests: ``ClusterEmulator`` (emulator.py) served over real HTTP.

Two fixtures give the same ``KubeApi`` handle (``.url``, ``.emulator``, ``.kubeconfig``,
``.env`` and the helpers below):

- ``kube_api``: the server runs on the test's own event loop (async tests, pytest-asyncio
  auto mode). Code under test calls the synchronous official client from worker threads
  (``asyncio.to_thread``), which works as long as the loop is not blocked: a blocking client
  call made on the loop itself never gets its answer.
- ``kube_api_thread``: the server runs on its own event loop in its own thread, so anything
  can call it: synchronous tests, blocking calls from the test's loop, and subprocesses
  (end-to-end tests start services with ``env={**os.environ, **kube_api_thread.env}``,
  which points ``KUBECONFIG`` at the server). Use it for anything beyond async unit tests.

The helpers are synchronous and run on the server's loop whichever thread calls them
(``call()`` runs any function of the emulator there): ``add_node``, ``set_ready``,
``break_watches``, ``compact``, ``objects``, ``get``, ``create``, ``patch_status``,
``delete``, ``watch_count``, ``requests`` (API requests served, by verb and resource) and
``reset_requests``; ``await wait_for_watch(kind)`` waits for a watch to be open.
Kinds are named by plural, singular, Kind or short name ("pods", "Pod", "tj"); for a
namespaced kind no namespace means "default", except in ``objects``, where it means all.

``kube_api_module`` is ``kube_api_thread`` shared by a module's tests. ``process_kubelet``
is a stand-in kubelet and scheduler (kubelet.py) that runs the pods pinned to its nodes
as local processes, for end-to-end tests.

``backend`` is the Kubernetes backend of this process on ``kube_api_thread`` and a real
nats-server, ``controller`` its controller running (helpers.Running), ``jobs`` the job
events on the bus.

How the official client (``kubernetes`` 37) sees the two stream failures:

- ``break_watches()``: the server ends each stream cleanly. ``Watch().stream(...)`` without
  ``timeout_seconds`` reconnects by itself from the resourceVersion of the last event it
  yielded, so the caller misses nothing; with ``timeout_seconds`` the generator just ends,
  and the caller resumes with ``Watch.stream(..., resource_version=w.resource_version)``.
- ``compact()`` then a watch from an older version: the server answers 200 and one ERROR
  event whose object is ``Status`` code 410, reason ``Expired``, message ``too old resource
  version: N (M)``, as a real server does. The client raises
  ``kubernetes.client.exceptions.ApiException`` with ``status == 410`` (its ``reason``
  reads ``"Expired: too old resource version: ..."``) out of the ``stream()`` generator:
  at once with ``timeout_seconds``; without it, after one silent retry from the same
  version that fails the same way. The caller must list again and watch from the list's
  ``metadata.resource_version``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import kmock
import pytest
import yaml

from resurge.cluster import open_backend
from resurge.cluster.kubernetes.backend import KubernetesBackend
from resurge.jobspec.crd import training_job_crd
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.collect import Events
from tests.kubernetes.emulator import ClusterEmulator
from tests.kubernetes.helpers import Running
from tests.kubernetes.kubelet import ProcessKubelet, process_environment, running_kubelet

T = TypeVar("T")

GPU = "nvidia.com/gpu"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def _timestamp() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_kubeconfig(path: Path, url: str, namespace: str = "default") -> Path:
    """A kubeconfig for ``url``: one cluster, no authentication, ``namespace`` by default."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class KubeApi:
    """The running server and the test side's handle on it."""

    url: str
    emulator: ClusterEmulator
    kubeconfig: Path
    loop: asyncio.AbstractEventLoop
    _loop_thread: int = field(repr=False)

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point a process (its official client) at the server."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for the server, from the kubeconfig."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def call(self, fn: Callable[[ClusterEmulator], T]) -> T:
        """Run ``fn(emulator)`` on the server's loop (at once if already there); its result."""
        if threading.get_ident() == self._loop_thread:
            return fn(self.emulator)

        async def run() -> T:
            return fn(self.emulator)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def add_node(
        self,
        name: str,
        gpus: int = 2,
        labels: dict[str, str] | None = None,
        ready: bool = True,
        address: str = "127.0.0.1",
    ) -> dict[str, Any]:
        """Register a v1 Node as a kubelet would: ``gpus`` of ``nvidia.com/gpu`` allocatable
        and in capacity, a Ready condition (``ready``), an InternalIP ``address``."""
        stamp = _timestamp()
        resources = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: str(gpus)}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": {"taints": [] if ready else self._not_ready_taints()},
            "status": {
                "capacity": resources,
                "allocatable": dict(resources),
                "conditions": [self._ready_condition(ready, stamp, stamp)],
                "addresses": [
                    {"type": "InternalIP", "address": address},
                    {"type": "Hostname", "address": name},
                ],
            },
        }
        return self.call(lambda em: em.create_object("nodes", node))

    @staticmethod
    def _ready_condition(ready: bool, heartbeat: str, transition: str) -> dict[str, str]:
        return {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "kubelet is posting ready status" if ready else "kubelet stopped posting",
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": transition,
        }

    @staticmethod
    def _not_ready_taints() -> list[dict[str, str]]:
        return [
            {"key": NOT_READY_TAINT, "effect": "NoSchedule"},
            {"key": NOT_READY_TAINT, "effect": "NoExecute", "timeAdded": _timestamp()},
        ]

    def set_ready(self, name: str, ready: bool) -> dict[str, Any]:
        """Set node ``name``'s Ready condition (a new heartbeat), and its not-ready taints as
        the node lifecycle controller does; two writes, status first, as on a cluster."""

        def change(em: ClusterEmulator) -> dict[str, Any]:
            node = em.get_object("nodes", name)
            stamp = _timestamp()
            conditions = node.get("status", {}).get("conditions", [])
            old = next((c for c in conditions if c.get("type") == "Ready"), None)
            same = old is not None and old.get("status") == ("True" if ready else "False")
            transition = old["lastTransitionTime"] if same and old else stamp
            condition = self._ready_condition(ready, stamp, transition)
            others = [c for c in conditions if c.get("type") != "Ready"]
            em.replace_object(
                "nodes",
                name,
                {**node, "status": {**node["status"], "conditions": [*others, condition]}},
                subresource="status",
            )
            taints = [
                t
                for t in node.get("spec", {}).get("taints") or []
                if t.get("key") != NOT_READY_TAINT
            ]
            if not ready:
                taints += self._not_ready_taints()
            return em.patch_object("nodes", name, {"spec": {"taints": taints}})

        return self.call(change)

    def break_watches(self) -> int:
        """End every open watch stream; how many there were."""
        return self.call(lambda em: em.break_watches())

    def compact(self) -> int:
        """Drop the event history up to now; the compacted resourceVersion."""
        return self.call(lambda em: em.compact())

    def objects(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The live objects of ``kind`` (plural, singular, Kind or short name), sorted."""
        return self.call(lambda em: em.current(kind, namespace))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """One live object (``kmock.KubernetesError`` 404 if there is none)."""
        return self.call(lambda em: em.get_object(kind, name, namespace))

    def create(
        self, kind: str, body: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Create an object as a client's POST would."""
        return self.call(lambda em: em.create_object(kind, body, namespace))

    def patch_status(
        self, kind: str, name: str, status: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch an object's ``.status`` (as a kubelet or a controller would)."""
        return self.call(
            lambda em: em.patch_object(
                kind, name, {"status": status}, namespace, subresource="status"
            )
        )

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """Delete an object as a client's DELETE would (finalizers and dependents honoured)."""
        return self.call(lambda em: em.delete_object(kind, name, namespace))

    def requests(self) -> dict[tuple[str, str], int]:
        """A copy of the count of API requests served so far, by (verb, resource).

        Verbs as the apiserver's audit log names them: get, list, watch, create, update,
        patch, delete, deletecollection; a subresource counts as e.g. "nodes/status".
        """
        return self.call(lambda em: dict(em.requests))

    def reset_requests(self) -> None:
        """Forget every request counted so far (``requests()`` starts from zero)."""
        self.call(lambda em: em.reset_requests())

    def watch_count(self, kind: str | None = None) -> int:
        """How many watch streams are open (on ``kind``, if given)."""
        return self.call(lambda em: em.watch_count(kind))

    async def wait_for_watch(self, kind: str, count: int = 1, within: float = 10.0) -> None:
        """Wait until ``count`` watches are open on ``kind`` (from any event loop)."""
        coro = self.emulator.wait_for_watch(kind, count, within)
        if threading.get_ident() == self._loop_thread:
            await coro
        else:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))


async def _serve(tmp_path: Path) -> AsyncIterator[KubeApi]:
    """Start the emulator on 127.0.0.1, a random port, on the running loop; stop it after."""
    async with ClusterEmulator() as emulator, kmock.Server(emulator) as server:
        # The CRD as the product generates it now, so the schema enforced is the one shipped.
        emulator.register_crd(training_job_crd())
        url = str(server.url).rstrip("/")
        api = KubeApi(
            url=url,
            emulator=emulator,
            kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url),
            loop=asyncio.get_running_loop(),
            _loop_thread=threading.get_ident(),
        )
        try:
            yield api
        finally:
            # Open watch streams would hold the server's shutdown; end them first.
            emulator.close_watches()


@pytest.fixture
async def kube_api(tmp_path: Path) -> AsyncIterator[KubeApi]:
    """The emulator on the test's event loop (see the module doc)."""
    async for api in _serve(tmp_path):
        yield api


def _run_in_thread(
    main: Callable[[], Coroutine[Any, Any, None]],
) -> tuple[threading.Thread, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())

    thread = threading.Thread(target=run, name="kube-api", daemon=True)
    thread.start()
    return thread, loop


@pytest.fixture
def kube_api_thread(tmp_path: Path) -> Iterator[KubeApi]:
    """The emulator on its own event loop in its own thread (see the module doc)."""
    yield from _serve_in_thread(tmp_path)


@pytest.fixture(scope="module")
def kube_api_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    """``kube_api_thread`` shared by a module's tests (end-to-end tests that share one
    control plane); its objects outlive each test, so each test names its own."""
    yield from _serve_in_thread(tmp_path_factory.mktemp("kube-api"))


@pytest.fixture
def process_kubelet(kube_api_thread: KubeApi, tmp_path: Path) -> Iterator[ProcessKubelet]:
    """A process kubelet (tests/kubernetes/kubelet.py) on ``kube_api_thread``: it stands
    in for the kubelet and the scheduler, which the emulator lacks, running pods pinned
    to the nodes it serves (none at first: ``.serve(name)``) as local processes. Pod
    output goes to ``tmp_path/pods``; every process is stopped at teardown."""
    env = process_environment(kube_api_thread.env)
    with running_kubelet(kube_api_thread.kubeconfig, env, tmp_path / "pods") as kubelet:
        yield kubelet


def _serve_in_thread(path: Path) -> Iterator[KubeApi]:
    started: concurrent.futures.Future[KubeApi] = concurrent.futures.Future()
    stop: asyncio.Event | None = None

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        try:
            async for api in _serve(path):
                started.set_result(api)
                await stop.wait()
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    thread, loop = _run_in_thread(main)
    api = started.result(timeout=30)
    try:
        yield api
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        # The HTTP server waits up to 60 s for requests still being handled (aiohttp's
        # shutdown timeout); a 30 s join once left the loop running (seen in CI).
        thread.join(timeout=90)
        assert not thread.is_alive(), "the API emulator did not stop within 90 s"
        loop.close()


@pytest.fixture
async def backend(
    kube_api_thread: KubeApi, bus: Bus, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> KubernetesBackend:
    """The Kubernetes backend, as the services open it, on ``kube_api_thread``."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kube_api_thread.kubeconfig))
    opened = await open_backend(bus, settings.model_copy(update={"cluster": "kubernetes"}))
    assert isinstance(opened, KubernetesBackend)
    return opened


@pytest.fixture
async def controller(backend: KubernetesBackend) -> AsyncIterator[Running]:
    """The controller the scaler runs, in this process, running until the test ends."""
    running = Running(backend)
    running.start()
    yield running
    await running.stop()


@pytest.fixture
async def jobs(bus: Bus) -> Events:
    """Every job event on the bus from now on."""
    seen = Events()
    await bus.subscribe(bus.subjects.all("job"), seen.add)
    return seen
