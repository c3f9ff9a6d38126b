"""A process kubelet for end-to-end tests: it stands in for the kubelet and the scheduler,
which the API emulator lacks.

:class:`ProcessKubelet` watches the emulator's pods with the official client (over HTTP,
as a kubelet watches its API server) and, for each pod pinned to one of its nodes (by
``spec.nodeName`` or by required node affinity ``matchFields metadata.name In [node]``,
as resurge pins its worker-group pods), does what a scheduler and a kubelet would:

- **binds** it: sets ``spec.nodeName`` (a merge patch: the emulator has no ``binding``
  subresource), unless the node is unschedulable or has a NoSchedule/NoExecute taint
  the pod does not tolerate; such a pod stays Pending (``PodScheduled`` False,
  ``Unschedulable``) and is tried again whenever the watch wakes;
- **runs** its first container's ``command`` + ``args`` as a local process in a session
  (process group) of its own, in the container's ``workingDir`` (else the kubelet's
  folder), with the test's environment, the pod's ``env`` on top (``value`` and the
  usual ``fieldRef`` paths) and a marker variable naming the pod's uid. The marker is
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

What it leaves out: images, cgroups and resource limits, volumes, probes, and the
network. Every pod runs in this machine's network, ``hostNetwork`` or not; its
``podIP`` and ``hostIP`` are its node's address. There is no cluster DNS: a pod's DNS
name (``<hostname>.<subdomain>.<namespace>.svc``, which a cluster's DNS serves for a pod
with ``spec.hostname`` and ``spec.subdomain`` naming a headless Service) resolves
nowhere here, so a job whose ranks must meet (MASTER_ADDR) trains here only on the host
network (its template's ``spec.hostNetwork: true``), where they meet at the node's
address.
"""

from __future__ import annotations

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


def pinned_node(pod: dict[str, Any]) -> str | None:
    """The node a pod is bound or pinned to (required node affinity on
    ``metadata.name``); None for a pod no scheduler here would place."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or []:
        for field_ in term.get("matchFields") or []:
            values = field_.get("values") or []
            if field_.get("key") == "metadata.name" and field_.get("operator") == "In" and values:
                return str(values[0])
    return None


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists" and not toleration.get("key"):
            return True
        if toleration.get("key") != taint.get("key"):
            continue
        if toleration.get("operator") == "Exists" or toleration.get("value") == taint.get("value"):
            return True
    return False


def unschedulable_because(node: dict[str, Any], pod: dict[str, Any]) -> str | None:
    """Why a scheduler would not bind ``pod`` to ``node``; None when it would."""
    spec = node.get("spec") or {}
    tolerations = list((pod.get("spec") or {}).get("tolerations") or [])
    if spec.get("unschedulable") and not _tolerated(
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}, tolerations
    ):
        return "node is unschedulable"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
            taint, tolerations
        ):
            return f"node has taint {taint.get('key')}:{taint.get('effect')}"
    return None


@dataclass
class PodRun:
    """One pod this kubelet runs: its processes, restarts and how it ended."""

    name: str
    uid: str
    node: str
    pod: dict[str, Any]
    log: Path
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
    service account); ``log_dir`` gets one output file per pod."""

    def __init__(
        self,
        kubeconfig: Path,
        env: Mapping[str, str],
        log_dir: Path,
        nodes: set[str] | None = None,
        namespace: str = "default",
    ) -> None:
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self.core = k8s.CoreV1Api(self.api)
        self.env = dict(env)
        self.log_dir = log_dir
        self.namespace = namespace
        self.nodes: set[str] = set(nodes or ())
        self.runs: dict[str, PodRun] = {}  # by pod uid
        self.deleted: list[tuple[str, str]] = []  # (name, uid) of each pod seen deleted
        self._waiting: dict[str, dict[str, Any]] = {}  # uid -> pod not yet bindable
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
                    self.core.list_namespaced_pod,
                    self.namespace,
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
        body = json_of(self.core.list_namespaced_pod(self.namespace, _preload_content=False))
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
        node = pinned_node(pod)
        with self._lock:
            mine = node is not None and node in self.nodes
        phase = (pod.get("status") or {}).get("phase")
        if not mine or phase in ("Succeeded", "Failed"):
            return
        self._waiting[uid] = pod
        self._try_bind(pod)

    def _retry_waiting(self) -> None:
        for pod in list(self._waiting.values()):
            self._try_bind(pod)

    def _try_bind(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        node = pinned_node(pod)
        assert node is not None
        try:
            node_obj = json_of(self.core.read_node(node, _preload_content=False))
        except ApiException as error:
            if error.status != 404:
                raise
            why: str | None = f"node {node} does not exist"
        else:
            why = unschedulable_because(node_obj, pod)
        if why is not None:
            scheduled = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": why,
            }
            current = (pod.get("status") or {}).get("conditions") or []
            if scheduled not in [{k: c.get(k) for k in scheduled} for c in current]:
                self._patch_status(pod, {"phase": "Pending", "conditions": [scheduled]})
                pod.setdefault("status", {})["conditions"] = [scheduled]
            return
        self._waiting.pop(meta["uid"], None)
        run = PodRun(
            name=meta["name"],
            uid=meta["uid"],
            node=node,
            pod=pod,
            log=self.log_dir / f"{meta['name']}.log",
        )
        with self._lock:
            self.runs[run.uid] = run
        run.thread = threading.Thread(target=self._run, args=(run,), name=f"pod-{run.name}")
        run.thread.daemon = True
        run.thread.start()

    # -- one pod --------------------------------------------------------------------------

    def _run(self, run: PodRun) -> None:
        try:
            self._lifecycle(run)
        except Exception as error:
            self._error(f"pod {run.name}: {error!r}")

    def _lifecycle(self, run: PodRun) -> None:
        try:
            self.core.patch_namespaced_pod(
                run.name,
                self.namespace,
                {"spec": {"nodeName": run.node}},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
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
        env = self._environment(run, container, address)
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

    def _environment(self, run: PodRun, container: dict[str, Any], address: str) -> dict[str, str]:
        fields = {
            "metadata.name": run.name,
            "metadata.namespace": self.namespace,
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
                self.namespace,
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
