"""A process kubelet for end-to-end tests: it stands in for the kubelet and the scheduler,
which the API emulator lacks.

:class:`ProcessKubelet` watches the emulator's pods in every namespace with the official
client (over HTTP, as a kubelet and kube-scheduler watch their API server) and does what
a scheduler and a kubelet would:

- **schedules** each pod not yet bound: a node is feasible when the filters of
  :mod:`tests.kubernetes.scheduler` pass (not unschedulable, its NoSchedule/NoExecute
  taints tolerated, ``nodeSelector`` and required node affinity matched, and the
  requests of every pod bound to it, anyone's, plus this one's within its allocatable:
  ``nvidia.com/gpu``, cpu, memory, pods). It binds the pod to the first feasible node
  it serves, by name (a merge patch of ``spec.nodeName``: the emulator has no
  ``binding`` subresource), counting it at once, as kube-scheduler's cache assumes a
  pod before the bind is seen. With no feasible node the pod stays Pending with
  ``PodScheduled`` False, reason ``Unschedulable`` and kube-scheduler's message
  (``0/3 nodes are available: 1 Insufficient nvidia.com/gpu, ...``), and is tried
  again whenever the watch wakes. A pod with ``schedulingGates`` is not scheduled until
  they are all removed (``PodScheduled`` False, ``SchedulingGated``), as "Pod
  Scheduling Readiness" in the Kubernetes docs says. A pod feasible only on nodes it does not serve
  waits for their kubelet. A pod created bound (``spec.nodeName``) to a node it
  serves is admitted as a kubelet admits it: one that does not fit the node's
  resources fails (``OutOf<resource>``);
- **runs** its first container's ``command`` + ``args`` as a local process in a session
  (process group) of its own, in the container's ``workingDir`` (else the kubelet's
  folder), with the test's environment, the pod's ``env`` on top (``value`` and the
  usual ``fieldRef`` paths, ``secretKeyRef`` read from the Secret; while a Secret or
  key is missing the container waits, ``CreateContainerConfigError``, as a kubelet's
  does) and a marker variable naming the pod's uid. The marker is
  the container boundary a cgroup gives a real kubelet: whatever the pod started, in
  whichever session (resurge's fork server and workers start sessions of their own),
  is found by it and killed with the pod. The output of every run goes to
  ``<log_dir>/<pod>.log``;
- **reports** the pod's phase through the status subresource: Pending, then Running
  with ``containerStatuses`` (``restartCount``, ``state.running``); Succeeded on exit
  0; with ``restartPolicy`` OnFailure a non-zero exit is restarted (after a short
  back-off, as a kubelet's crash-loop back-off) and ``restartCount`` bumped (Always
  restarts any exit); otherwise Failed. When the container's main process exits,
  whatever it left behind is killed, as a container's end kills its PID namespace;
- **stops** a deleted pod (or one given a ``deletionTimestamp``): SIGTERM to its process
  group, SIGKILL to the group and every marked process after
  ``terminationGracePeriodSeconds``.

:meth:`ProcessKubelet.close` stops every pod's processes (SIGTERM, then SIGKILL after a
few seconds) and the watch; nothing it started outlives it. Linux only (``/proc``).

What it leaves out: what :mod:`tests.kubernetes.scheduler` leaves out of scheduling
(scoring, inter-pod affinity, preemption, ...), images, cgroups and resource limits,
volumes, probes, and the network. Every pod runs in this machine's network,
``hostNetwork`` or not; its ``podIP`` and ``hostIP`` are its node's address. There is
no cluster DNS: a pod's DNS name (``<hostname>.<subdomain>.<namespace>.svc``, which a
cluster's DNS serves for a pod with ``spec.hostname`` and ``spec.subdomain`` naming a
headless Service) resolves nowhere here, so a job whose ranks must meet (MASTER_ADDR)
trains here only on the host network (its template's ``spec.hostNetwork: true``),
where they meet at the node's address.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from tests.kubernetes.scheduler import feasibility, pod_requests, quantity, unschedulable_message

__all__ = [
    "POD_MARKER",
    "PodRun",
    "ProcessKubelet",
    "pod_processes",
    "process_environment",
    "running_kubelet",
]

log = logging.getLogger("tests.kubelet")

# The variable every process of a pod carries: the pod's uid.
POD_MARKER = "TEST_KUBELET_POD_UID"
MERGE_PATCH = "application/merge-patch+json"
_TEARDOWN_GRACE_SECONDS = 5.0
_WATCH_SECONDS = 1
_MAX_BACKOFF_SECONDS = 10.0
# What kube-scheduler says of a pod it holds back for its scheduling gates.
_GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def process_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a test's processes start from: the test's own without resurge's
    and torchrun's variables, this interpreter's folder first on ``PATH`` (so
    ``python`` and the console scripts are the virtualenv's), one OpenMP thread,
    unbuffered output; ``extra`` on top."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RESURGE_", "TORCHELASTIC_", "PYTEST_"))
        and key not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "KUBECONFIG"}
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def pod_processes(uid: str) -> list[int]:
    """The live processes (of this user) whose environment carries pod ``uid``'s marker."""
    wanted = f"{POD_MARKER}={uid}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):
            if wanted in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
    return found


def _kill(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _MissingSecret(LookupError):
    """A Secret, or its key, that a container's environment names is not there."""


@dataclass
class PodRun:
    """One pod this kubelet runs: its processes, restarts and how it ended."""

    name: str
    uid: str
    node: str
    pod: dict[str, Any]
    log: Path
    namespace: str = "default"
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    phase: str = "Pending"
    exit_codes: list[int] = field(default_factory=list)
    deleted: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None
    stopper: threading.Thread | None = None

    @property
    def grace_seconds(self) -> float:
        return float((self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))

    @property
    def pgid(self) -> int | None:
        """The process group of the container's current main process."""
        return None if self.process is None else self.process.pid

    def pids(self) -> list[int]:
        """Every live process of the pod now."""
        return pod_processes(self.uid)


class ProcessKubelet:
    """See the module docstring. ``nodes`` are the node names it serves (more can be
    added with :meth:`serve`); ``env`` is the environment each container starts from
    (the test's, with ``PATH`` and ``KUBECONFIG``, which stands in for the pod's
    service account); ``log_dir`` gets one output file per pod. It watches the pods
    of every namespace."""

    def __init__(
        self,
        kubeconfig: Path,
        env: Mapping[str, str],
        log_dir: Path,
        nodes: set[str] | None = None,
    ) -> None:
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self.core = k8s.CoreV1Api(self.api)
        self.env = dict(env)
        self.log_dir = log_dir
        self.nodes: set[str] = set(nodes or ())
        self.runs: dict[str, PodRun] = {}  # by pod uid
        self.deleted: list[tuple[str, str]] = []  # (name, uid) of each pod seen deleted
        self._waiting: dict[str, dict[str, Any]] = {}  # uid -> pod not yet bindable
        # Every pod not deleted, by uid, as last seen (or as bound here: assumed).
        self.pods: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self._synced = threading.Event()
        self.errors: list[str] = []

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> ProcessKubelet:
        """Start watching pods; return once the first list has been taken in."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._watcher = threading.Thread(target=self._watch, name="process-kubelet", daemon=True)
        self._watcher.start()
        if not self._synced.wait(30):
            raise RuntimeError(f"the process kubelet could not list pods: {self.errors}")
        return self

    def __enter__(self) -> ProcessKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def serve(self, node: str) -> None:
        """Run the pods pinned to ``node`` from now on."""
        with self._lock:
            self.nodes.add(node)

    def close(self) -> None:
        """Stop every pod's processes and the watch; nothing started here is left."""
        self._closing.set()
        if self._watcher is not None:
            self._watcher.join(timeout=_WATCH_SECONDS + 30)
        with self._lock:
            runs = list(self.runs.values())
        for run in runs:
            run.deleted.set()
            with run.lock:
                if run.pgid is not None:
                    _killpg(run.pgid, signal.SIGTERM)
        deadline = time.monotonic() + _TEARDOWN_GRACE_SECONDS
        for run in runs:
            if run.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        for run in runs:
            self._kill_all(run)
        for run in runs:
            for thread in (run.thread, run.stopper):
                if thread is not None:
                    thread.join(timeout=30)
        self.api.close()

    # -- queries --------------------------------------------------------------------------

    def run_of(self, name: str) -> PodRun | None:
        """The newest run of the pod named ``name``."""
        with self._lock:
            found = [r for r in self.runs.values() if r.name == name]
        return found[-1] if found else None

    def all_pids(self) -> list[int]:
        """Every live process of every pod this kubelet ran."""
        with self._lock:
            uids = list(self.runs)
        return [pid for uid in uids for pid in pod_processes(uid)]

    # -- the watch ------------------------------------------------------------------------

    def _watch(self) -> None:
        version: str | None = None
        while not self._closing.is_set():
            try:
                if version is None:
                    version = self._relist()
                    self._synced.set()
                stream = k8s_watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.core.list_pod_for_all_namespaces,
                    resource_version=version,
                    timeout_seconds=_WATCH_SECONDS,
                    _request_timeout=(10, 10),
                    deserialize=False,
                )
                for event in stream:
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    self._on_pod(event["type"], obj)
                    if self._closing.is_set():
                        break
                self._retry_waiting()
            except ApiException as error:
                if error.status == 410:
                    version = None  # too old: list again
                    continue
                self._error(f"pod watch: {error.status} {error.reason}")
                self._closing.wait(0.5)
            except Exception as error:  # a kubelet keeps going, and says why
                self._error(f"pod watch: {error!r}")
                self._closing.wait(0.5)

    def _relist(self) -> str:
        body = json_of(self.core.list_pod_for_all_namespaces(_preload_content=False))
        present = set()
        for pod in body.get("items") or []:
            present.add((pod.get("metadata") or {}).get("uid"))
            self._on_pod("ADDED", pod)
        with self._lock:
            gone = [run for uid, run in self.runs.items() if uid not in present]
        for run in gone:
            self._on_pod("DELETED", run.pod)
        return str(body["metadata"]["resourceVersion"])

    def _error(self, text: str) -> None:
        self.errors.append(text)
        log.warning("process kubelet: %s", text)

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        with self._lock:
            run = self.runs.get(uid)
        if kind == "DELETED":
            self.pods.pop(uid, None)
        elif not (uid in self.pods and _bound(self.pods[uid]) and not _bound(pod)):
            self.pods[uid] = pod  # (a stale event never unbinds what was bound here)
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            self._waiting.pop(uid, None)
            if kind == "DELETED":
                self.deleted.append((str(meta.get("name")), uid))
            if run is not None and not run.deleted.is_set():
                self._stop(run)
            return
        if run is not None:
            run.pod = pod
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return
        node = (pod.get("spec") or {}).get("nodeName")
        with self._lock:
            if node is not None and node not in self.nodes:
                return  # another kubelet's
        self._waiting[uid] = pod
        self._try_bind(pod, self._list_nodes())

    def _retry_waiting(self) -> None:
        if self._waiting:
            nodes = self._list_nodes()
            for pod in list(self._waiting.values()):
                self._try_bind(pod, nodes)

    def _list_nodes(self) -> list[dict[str, Any]]:
        items = json_of(self.core.list_node(_preload_content=False)).get("items") or []
        return sorted(items, key=lambda n: str((n.get("metadata") or {}).get("name")))

    def _try_bind(self, pod: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
        """Schedule ``pod`` (or admit it, when it came bound to a node served here) and
        start it; or say why it waits (the module docstring)."""
        meta = pod["metadata"]
        uid = meta["uid"]
        pods = list(self.pods.values())
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound is not None:
            node_obj = next((n for n in nodes if n["metadata"]["name"] == bound), None)
            with self._lock:
                mine = bound in self.nodes
            if node_obj is None or not mine:
                return  # no node, or not served (yet): its kubelet would admit it
            short = [r for r in feasibility(pod, node_obj, pods) if r.startswith("Insufficient")]
            if short:
                self._reject(pod, node_obj, short[0].removeprefix("Insufficient "), pods)
                return
            node = str(bound)
        elif (pod.get("spec") or {}).get("schedulingGates"):
            self._unschedulable(pod, _GATED_MESSAGE, reason="SchedulingGated")
            return  # not scheduled until every gate is removed
        else:
            reasons = {n["metadata"]["name"]: feasibility(pod, n, pods) for n in nodes}
            with self._lock:
                served = [name for name, why in reasons.items() if not why and name in self.nodes]
            if not served:
                if not any(not why for why in reasons.values()):
                    self._unschedulable(pod, unschedulable_message(len(nodes), reasons.values()))
                return  # feasible elsewhere only: that node's kubelet binds it
            node = served[0]
            try:
                self.core.patch_namespaced_pod(
                    meta["name"],
                    _namespace(pod),
                    {"spec": {"nodeName": node}},
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                )
            except ApiException as error:
                if error.status == 404:
                    self._waiting.pop(uid, None)
                    return
                raise
            pod = {**pod, "spec": {**pod["spec"], "nodeName": node}}
            self.pods[uid] = pod  # assumed: counted before the watch shows the bind
        self._waiting.pop(uid, None)
        run = PodRun(
            name=meta["name"],
            uid=uid,
            node=node,
            pod=pod,
            log=self.log_dir / f"{meta['name']}.log",
            namespace=_namespace(pod),
        )
        with self._lock:
            self.runs[run.uid] = run
        run.thread = threading.Thread(target=self._run, args=(run,), name=f"pod-{run.name}")
        run.thread.daemon = True
        run.thread.start()

    def _unschedulable(
        self, pod: dict[str, Any], message: str, reason: str = "Unschedulable"
    ) -> None:
        scheduled = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
        }
        current = (pod.get("status") or {}).get("conditions") or []
        if scheduled not in [{k: c.get(k) for k in scheduled} for c in current]:
            self._patch_status(pod, {"phase": "Pending", "conditions": [scheduled]})
            pod.setdefault("status", {})["conditions"] = [scheduled]

    def _reject(
        self,
        pod: dict[str, Any],
        node: dict[str, Any],
        resource: str,
        pods: list[dict[str, Any]],
    ) -> None:
        """Fail a pod bound to a node that has no room for it, as a kubelet's admission."""
        self._waiting.pop(pod["metadata"]["uid"], None)
        name = node["metadata"]["name"]
        used = sum(
            (
                pod_requests(p).get(resource, 0)
                for p in pods
                if (p.get("spec") or {}).get("nodeName") == name
                and p["metadata"]["uid"] != pod["metadata"]["uid"]
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ),
            start=quantity(0),
        )
        have = ((node.get("status") or {}).get("allocatable") or {}).get(resource, 0)
        self._patch_status(
            pod,
            {
                "phase": "Failed",
                "reason": f"OutOf{resource}",
                "message": (
                    f"Pod was rejected: Node didn't have enough resource: {resource}, "
                    f"requested: {pod_requests(pod).get(resource)}, used: {used}, "
                    f"capacity: {have}"
                ),
            },
        )

    # -- one pod --------------------------------------------------------------------------

    def _run(self, run: PodRun) -> None:
        try:
            self._lifecycle(run)
        except Exception as error:
            self._error(f"pod {run.name}: {error!r}")

    def _lifecycle(self, run: PodRun) -> None:
        try:
            self.core.read_namespaced_pod(run.name, run.namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        address = self._node_address(run.node)
        self._patch_status(
            run.pod,
            {
                "phase": "Pending",
                "hostIP": address,
                "podIP": address,
                "conditions": [{"type": "PodScheduled", "status": "True"}],
            },
        )
        container = ((run.pod.get("spec") or {}).get("containers") or [{}])[0]
        policy = (run.pod.get("spec") or {}).get("restartPolicy") or "Always"
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        env = self._environment_when_ready(run, container, address)
        if env is None:
            return
        cwd = container.get("workingDir") or str(self.log_dir)
        backoff = 1.0
        while True:
            with run.lock:
                if run.deleted.is_set():
                    return
                with run.log.open("ab") as out:
                    out.write(f"--- {_now()} start {run.restarts}: {argv}\n".encode())
                    out.flush()
                    run.process = subprocess.Popen(
                        argv,
                        env=env,
                        cwd=cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            started = _now()
            run.phase = "Running"
            self._patch_status(
                run.pod,
                {
                    "phase": "Running",
                    "startTime": started,
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "True"},
                    ],
                    "containerStatuses": [
                        self._container_status(run, container, {"running": {"startedAt": started}})
                    ],
                },
            )
            code = run.process.wait()
            run.exit_codes.append(code)
            self._kill_all(run)  # the container's end ends everything in it
            with run.log.open("ab") as out:
                out.write(f"--- {_now()} exit {code}\n".encode())
            if run.deleted.is_set():
                return
            terminated = {"terminated": {"exitCode": code, "finishedAt": _now()}}
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
            if not restart:
                run.phase = "Succeeded" if code == 0 else "Failed"
                self._patch_status(
                    run.pod,
                    {
                        "phase": run.phase,
                        "conditions": [
                            {"type": "PodScheduled", "status": "True"},
                            {"type": "Ready", "status": "False"},
                        ],
                        "containerStatuses": [
                            self._container_status(run, container, terminated, ready=False)
                        ],
                    },
                )
                return
            run.restarts += 1
            status = self._container_status(run, container, {"waiting": {"reason": "Back-off"}})
            status["lastState"] = terminated
            self._patch_status(run.pod, {"containerStatuses": [status]})
            if run.deleted.wait(backoff):
                return
            backoff = min(_MAX_BACKOFF_SECONDS, backoff * 2)

    def _container_status(
        self,
        run: PodRun,
        container: dict[str, Any],
        state: dict[str, Any],
        ready: bool = True,
    ) -> dict[str, Any]:
        return {
            "name": container.get("name") or "main",
            "image": container.get("image") or "",
            "imageID": "",
            "containerID": f"process://{run.uid}/{run.restarts}",
            "ready": ready and "running" in state,
            "started": "running" in state,
            "restartCount": run.restarts,
            "state": state,
        }

    def _environment_when_ready(
        self, run: PodRun, container: dict[str, Any], address: str
    ) -> dict[str, str] | None:
        """The container's environment once every Secret it names has its key (None if
        the pod is deleted first); meanwhile its status says why it waits."""
        told = ""
        while True:
            try:
                return self._environment(run, container, address)
            except _MissingSecret as missing:
                if str(missing) != told:
                    told = str(missing)
                    waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": told}}
                    status = {
                        "containerStatuses": [self._container_status(run, container, waiting)]
                    }
                    self._patch_status(run.pod, status)
            if run.deleted.wait(0.2):
                return None

    def _secret_value(self, namespace: str, ref: dict[str, Any]) -> str | None:
        """A ``secretKeyRef``'s value; :class:`_MissingSecret` if the Secret or its key is
        missing (None where the reference is ``optional``)."""
        name, key = str(ref.get("name") or ""), str(ref.get("key") or "")
        try:
            secret = json_of(
                self.core.read_namespaced_secret(name, namespace, _preload_content=False)
            )
        except ApiException as error:
            if error.status != 404:
                raise
            secret = None
        data = (secret or {}).get("data") or {}
        if key in data:
            return base64.b64decode(data[key]).decode()
        if ref.get("optional"):
            return None
        if secret is None:
            raise _MissingSecret(f'secret "{name}" not found')
        raise _MissingSecret(f"couldn't find key {key} in Secret {namespace}/{name}")

    def _environment(self, run: PodRun, container: dict[str, Any], address: str) -> dict[str, str]:
        fields = {
            "metadata.name": run.name,
            "metadata.namespace": run.namespace,
            "metadata.uid": run.uid,
            "spec.nodeName": run.node,
            "status.hostIP": address,
            "status.podIP": address,
        }
        env = dict(self.env)
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif (ref := ((item.get("valueFrom") or {}).get("fieldRef") or {})).get("fieldPath"):
                value = fields.get(ref["fieldPath"])
                if value is not None:
                    env[item["name"]] = value
            elif secret_ref := (item.get("valueFrom") or {}).get("secretKeyRef"):
                secret_value = self._secret_value(run.namespace, secret_ref)
                if secret_value is not None:
                    env[item["name"]] = secret_value
        env[POD_MARKER] = run.uid
        return env

    def _node_address(self, node: str) -> str:
        with contextlib.suppress(ApiException):
            obj = json_of(self.core.read_node(node, _preload_content=False))
            for address in (obj.get("status") or {}).get("addresses") or []:
                if address.get("type") == "InternalIP":
                    return str(address["address"])
        return "127.0.0.1"

    def _patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"],
                _namespace(pod),
                {"status": status},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        except ApiException as error:
            if error.status != 404:  # a deleted pod has no status to report
                self._error(f"status of pod {meta['name']}: {error.status} {error.reason}")

    # -- stopping -------------------------------------------------------------------------

    def _stop(self, run: PodRun) -> None:
        """A deleted pod: SIGTERM, SIGKILL after its grace (in a thread of its own)."""
        run.deleted.set()

        def stop() -> None:
            with run.lock:
                process = run.process
            if process is not None and process.poll() is None:
                _killpg(process.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=run.grace_seconds)
            self._kill_all(run)

        run.stopper = threading.Thread(target=stop, name=f"stop-{run.name}", daemon=True)
        run.stopper.start()

    def _kill_all(self, run: PodRun) -> None:
        """SIGKILL the pod's process group and every marked process, until none is left
        (bounded: a process of ours that SIGKILL cannot end is a bug to report)."""
        deadline = time.monotonic() + 30
        while True:
            if run.pgid is not None:
                _killpg(run.pgid, signal.SIGKILL)
            left = run.pids()
            if not left:
                break
            _kill(left, signal.SIGKILL)
            if time.monotonic() > deadline:
                self._error(f"pod {run.name}: processes {left} outlived SIGKILL")
                break
            time.sleep(0.05)  # reaped by their parents; re-read /proc
        if run.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.process.wait(timeout=10)


def _bound(pod: dict[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _namespace(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def json_of(response: Any) -> dict[str, Any]:
    """The JSON body of a ``_preload_content=False`` response."""
    data: dict[str, Any] = json.loads(response.data)
    return data


@contextlib.contextmanager
def running_kubelet(
    kubeconfig: Path, env: Mapping[str, str], log_dir: Path, nodes: set[str] | None = None
) -> Iterator[ProcessKubelet]:
    """A started :class:`ProcessKubelet`, closed on the way out."""
    kubelet = ProcessKubelet(kubeconfig, env, log_dir, nodes)
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.close()
