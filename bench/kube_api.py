"""Kubernetes API load: requests per minute by verb against an API server with 1,000 Nodes,
idle and during a recovery, for the code of a baseline commit and for this tree.

What runs is the real backend code, in one process per code version, against the API
emulator (tests/kubernetes/emulator.py, kmock over real HTTP, in a process of its own
that counts every request by verb and resource as the apiserver's audit log names them)
and a real nats-server:

- the scaler: a ``KubernetesBackend`` running the controller ``reconcile()`` runs (its
  Node, pod and TrainingJob loops; this tree's leader election is left out: its Lease
  renewals are a few requests a minute per scaler, whatever the cluster's size) and its
  tick's cluster reads every second (``live_nodes`` and ``list_nodes``, as
  ``read_snapshot`` makes them);
- the restarter: a ``KubernetesBackend`` of its own (reads only during the recovery);
- 1,000 node monitors: 1,000 monitor processes are not possible here, so the report loop
  of each (``report_node`` with the monitor's report, every ``HEARTBEAT_SECONDS`` as
  ``NodeMonitor`` does) runs in this one process: one ``KubernetesBackend`` per monitor
  (each with its own state), sharing one API client. Their clock is simulated: each
  simulated second the monitors due report with that second's heartbeat, then the
  scaler ticks; a simulated second takes at least a real one (the watches and bookmarks
  run on real time), more when the emulator cannot keep up (the real duration is
  printed). Requests are per simulated minute, but for watches (a watch is started
  again on real time: the server's timeout, a read timeout), which are per real minute.

A minute each: idle (a 4-replica TrainingJob running, nothing happening), then a
recovery: at second 10 a GPU of a node under the job fails; its monitor reports it
unhealthy from then on, the restarter reads the cluster (its placement snapshot),
cordons the node and moves the replica to a spare node (the worker-group records on
NATS; the scaler's controller deletes the old pod and creates the new one), and the
scaler writes the job's status (Recovering, then Running with the recovery). Before
them, ``start``: each monitor's first report and the scaler's first tick (the job and its
pods are made before counting starts). The emulator sends a bookmark about every minute,
as a real apiserver does.

The baseline is run from a ``git worktree`` of ``--baseline`` (default 7436cd3, the
code before informers and node leases), with the same emulator, which the bench takes
from this tree. kmock keeps every request it served for assertions and matches each
new one against them (a cost that grows with each request); the emulator process
forgets that history every simulated second (its counts are kept apart).

This is a benchmark, not a test: it prints, it does not assert.

    .venv/bin/python bench/kube_api.py [--nodes 1000] [--seconds 60] [--baseline REV]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
PHASES = ("start", "idle", "recovery")
NAMESPACE = "default"
JOB = "bench"
REPLICAS = 4
FAILED_AT = 10  # the simulated second of the recovery minute the GPU fails


# -- the emulator's process -------------------------------------------------------------


def serve(folder: Path) -> None:
    """Run the emulator until told to stop, with a control endpoint beside it:
    ``POST /nodes?count=N``, ``GET /requests``, ``POST /reset``, ``POST /forget``,
    ``POST /stop``. Writes ``ready.json`` (kubeconfig, control URL) once it listens."""
    sys.path.insert(0, str(REPO))
    import aiohttp.web
    from tests.kubernetes.conftest import _serve

    async def main() -> None:
        async for api in _serve(folder):
            await _control(api, folder)

    async def _control(api: Any, folder: Path) -> None:
        stop = asyncio.Event()
        emulator = api.emulator
        emulator.bookmark_interval = 60.0  # as a real apiserver: about every minute

        def forget() -> None:  # kmock's request history, not the emulator's counts
            emulator._requests.clear()
            for payload in emulator._payloads:
                held = getattr(payload, "_requests", None)
                if isinstance(held, list):
                    held.clear()

        async def nodes(request: aiohttp.web.Request) -> aiohttp.web.Response:
            for index in range(int(request.query["count"])):
                api.add_node(node_name(index), gpus=8)
            forget()
            return aiohttp.web.json_response({})

        async def requests(_: aiohttp.web.Request) -> aiohttp.web.Response:
            counted = [[verb, resource, n] for (verb, resource), n in emulator.requests.items()]
            return aiohttp.web.json_response(counted)

        async def reset(_: aiohttp.web.Request) -> aiohttp.web.Response:
            emulator.reset_requests()
            return aiohttp.web.json_response({})

        async def forget_history(_: aiohttp.web.Request) -> aiohttp.web.Response:
            forget()
            return aiohttp.web.json_response({})

        async def stopping(_: aiohttp.web.Request) -> aiohttp.web.Response:
            stop.set()
            return aiohttp.web.json_response({})

        app = aiohttp.web.Application()
        app.router.add_post("/nodes", nodes)
        app.router.add_get("/requests", requests)
        app.router.add_post("/reset", reset)
        app.router.add_post("/forget", forget_history)
        app.router.add_post("/stop", stopping)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready = {"kubeconfig": str(api.kubeconfig), "control": f"http://127.0.0.1:{port}"}
        (folder / "ready.json").write_text(json.dumps(ready))
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def node_name(index: int) -> str:
    return f"node-{index:04d}"


# -- the measured process (imports resurge from the tree under test) ---------------------


def control(url: str, path: str, method: str = "POST") -> Any:
    request = urllib.request.Request(
        url + path, method=method, data=b"" if method == "POST" else None
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def measure(control_url: str, nats_url: str, nodes: int, seconds: int) -> dict[str, Any]:
    """Run the phases with the tree's resurge (first on sys.path); the counts of each."""
    return asyncio.run(_measure(control_url, nats_url, nodes, seconds))


async def _measure(control_url: str, nats_url: str, nodes: int, seconds: int) -> dict[str, Any]:
    from datetime import UTC, datetime, timedelta

    from kubernetes import client as k8s

    import resurge
    from resurge.cluster import NodeInfo, WorkerGroupSpec
    from resurge.cluster.kubernetes.api import KubeApi, api_client
    from resurge.cluster.kubernetes.backend import KubernetesBackend
    from resurge.cluster.kubernetes.controller import Controller
    from resurge.runtime.bus import Bus
    from resurge.runtime.settings import Settings
    from resurge_node_agent.monitor.node_monitor import HEARTBEAT_SECONDS

    async def call(path: str, method: str = "POST") -> Any:
        return await asyncio.to_thread(control, control_url, path, method)

    settings = Settings(
        nats_url=nats_url,
        namespace=f"b{os.getpid()}",
        cluster="kubernetes",
        kube_namespace=NAMESPACE,
    )
    bus = await Bus.connect(settings, "bench")
    await bus.ensure_streams()
    await call(f"/nodes?count={nodes}")
    scaler = await KubernetesBackend.open(bus, settings)
    restarter = await KubernetesBackend.open(bus, settings)
    shared = api_client()
    shared.configuration.connection_pool_maxsize = 16
    shared.rest_client.pool_manager.connection_pool_kw["maxsize"] = 16
    kube = KubeApi(shared, NAMESPACE)
    monitors = [KubernetesBackend(bus, scaler.records, kube, settings) for _ in range(nodes)]
    custom = k8s.CustomObjectsApi(api_client())
    await asyncio.to_thread(
        custom.create_namespaced_custom_object,
        "resurge.dev",
        "v1alpha1",
        NAMESPACE,
        "trainingjobs",
        {
            "apiVersion": "resurge.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": JOB},
            "spec": {
                "command": ["python", "train.py"],
                "image": "registry/train:1",
                "nprocPerNode": 8,
                "replicas": {"min": REPLICAS, "max": REPLICAS},
            },
        },
    )

    def group(replica: int, node: str, incarnation: int = 0) -> WorkerGroupSpec:
        return WorkerGroupSpec(
            job=JOB,
            replica=replica,
            node=node,
            nproc=8,
            command=["python", "train.py"],
            incarnation=incarnation,
        )

    failed = node_name(1)
    unhealthy: set[str] = set()
    clock = datetime.now(UTC)
    beats = {"due": 0, "done": 0}
    limit = asyncio.Semaphore(8)

    async def report(index: int, when: datetime) -> None:
        name = node_name(index)
        info = NodeInfo(name=name, slots=8, healthy=name not in unhealthy, heartbeat=when)
        async with limit:
            await monitors[index].report_node(info)
        beats["done"] += 1

    async def tick() -> None:  # the scaler's cluster reads each TICK_SECONDS
        await scaler.live_nodes()
        await scaler.list_nodes()

    async def second(at: int, start: datetime) -> None:
        """One simulated second: the monitors due report, the scaler ticks."""
        when = start + timedelta(seconds=at)
        due = [i for i in range(nodes) if (at + i) % int(HEARTBEAT_SECONDS) == 0]
        beats["due"] += len(due)
        await asyncio.gather(*(report(i, when) for i in due))
        await tick()
        await call("/forget")

    async def minute(start: datetime, events: dict[int, Any]) -> float:
        began = time.monotonic()
        for at in range(seconds):
            paced = time.monotonic()
            if at in events:
                await events[at]()
            await second(at, start)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - paced)))
        return time.monotonic() - began

    results: dict[str, Any] = {"tree": str(resurge.__file__)}
    # The controller as reconcile() runs it; this tree runs it under leader election, whose
    # Lease renewals (a few requests a minute per scaler, whatever the cluster's size) are
    # left out of both runs.
    controller = Controller(scaler.kube, bus, scaler.records, settings)
    reconciling = asyncio.create_task(controller.run())
    try:
        for replica in range(REPLICAS):
            await scaler.create_worker_group(group(replica, node_name(replica)))
        core = k8s.CoreV1Api(api_client())
        while True:  # the controller makes the job's pods (the bench's reads not counted)
            pods = await asyncio.to_thread(
                core.list_namespaced_pod, NAMESPACE, label_selector=f"resurge.dev/job={JOB}"
            )
            if len(pods.items) == REPLICAS:
                break
            await asyncio.sleep(0.2)
        await call("/reset")
        began = time.monotonic()
        await asyncio.gather(*(report(i, clock) for i in range(nodes)))
        await tick()
        results["start"] = {
            "counts": await call("/requests", "GET"),
            "seconds": time.monotonic() - began,
        }

        await call("/reset")
        beats.update(due=0, done=0)
        clock += timedelta(seconds=HEARTBEAT_SECONDS)
        took = await minute(clock, {})
        results["idle"] = {"counts": await call("/requests", "GET"), "seconds": took, **beats}

        async def fail() -> None:
            unhealthy.add(failed)
            await scaler.write_job_status(
                JOB, {"name": JOB, "phase": "Recovering", "generation": 2, "message": "XID 79"}
            )
            await restarter.live_nodes()  # the restarter's placement snapshot
            await restarter.list_nodes()
            await restarter.cordon(failed, reason="XID 79 on GPU 3")
            await restarter.delete_worker_group(JOB, 1, failed)
            await restarter.create_worker_group(group(1, node_name(REPLICAS), incarnation=1))

        async def recovered() -> None:
            recovery = {"level": "pod", "reason": "XID 79", "seconds": 2.0, "generation": 2}
            await scaler.write_job_status(
                JOB,
                {
                    "name": JOB,
                    "phase": "Running",
                    "generation": 2,
                    "replicas": {"current": REPLICAS, "target": REPLICAS},
                    "restarts": {"pod": 1},
                    "lastRecovery": recovery,
                },
            )

        await call("/reset")
        beats.update(due=0, done=0)
        clock += timedelta(seconds=seconds)
        took = await minute(clock, {FAILED_AT: fail, FAILED_AT + 2: recovered})
        results["recovery"] = {"counts": await call("/requests", "GET"), "seconds": took, **beats}
    finally:
        reconciling.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reconciling
        await bus.close()
    return results


# -- the orchestration --------------------------------------------------------------------


@contextlib.contextmanager
def baseline_tree(revision: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="kube-api-baseline-"))
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), revision],
        check=True,
        capture_output=True,
    )
    try:
        yield folder
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)],
            check=False,
            capture_output=True,
        )


def run_version(tree: Path, nats_url: str, nodes: int, seconds: int) -> dict[str, Any]:
    """The phases' counts of the code in ``tree``, against a fresh emulator."""
    folder = Path(tempfile.mkdtemp(prefix="kube-api-"))
    emulator = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "emulator.log").open("wb"),
    )
    try:
        deadline = time.monotonic() + 60
        while not (folder / "ready.json").exists():
            if emulator.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the emulator did not start: {folder / 'emulator.log'}")
            time.sleep(0.1)
        ready = json.loads((folder / "ready.json").read_text())
        paths = [tree / "shared", tree / "services" / "node-agent"]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(str(p) for p in paths),
            "KUBECONFIG": ready["kubeconfig"],
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        out = folder / "measure.json"
        argv = [sys.executable, __file__, "--measure", ready["control"], "--nats", nats_url]
        argv += ["--nodes", str(nodes), "--seconds", str(seconds), "--out", str(out)]
        with (folder / "measure.log").open("wb") as log:
            subprocess.run(argv, env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    finally:
        with contextlib.suppress(Exception):
            control(ready["control"], "/stop")
        try:
            emulator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            emulator.kill()


def per_verb(phase: dict[str, Any], seconds: int) -> dict[str, float]:
    """Requests per minute by verb (for ``start``: in all). Watches are started again on
    real time (a server's timeout, a read timeout): per real minute; the rest follows the
    simulated clock: per simulated minute."""
    totals = dict.fromkeys(VERBS, 0.0)
    for verb, _resource, count in phase["counts"]:
        totals[verb] = totals.get(verb, 0.0) + count
    if not seconds:
        return totals
    return {
        verb: n * 60 / (phase["seconds"] if verb == "watch" else seconds)
        for verb, n in totals.items()
    }


def by_resource(phase: dict[str, Any]) -> str:
    rows = sorted(phase["counts"], key=lambda row: (-row[2], row[0], row[1]))
    return ", ".join(f"{verb} {resource} {n}" for verb, resource, n in rows)


def print_report(results: dict[str, dict[str, Any]], nodes: int, seconds: int) -> None:
    names = list(results)
    print(
        f"Kubernetes API requests, {nodes} Nodes, by verb: per simulated minute (watch: per"
        " real minute); start: in all"
    )
    for phase in PHASES:
        print(f"\n{phase}:")
        print(f"  {'verb':8}" + "".join(f"{name:>20}" for name in names) + f"{'ratio':>10}")
        rows = {
            name: per_verb(results[name][phase], 0 if phase == "start" else seconds)
            for name in names
        }
        for verb in (*VERBS, "total"):
            values = [
                sum(rows[name].values()) if verb == "total" else rows[name].get(verb, 0.0)
                for name in names
            ]
            ratio = (
                f"{values[1] / values[0]:.3f}" if values[0] else ("-" if not values[1] else "new")
            )
            print(f"  {verb:8}" + "".join(f"{v:>20.0f}" for v in values) + f"{ratio:>10}")
        for name in names:
            data = results[name][phase]
            extra = f", reports done/due {data['done']}/{data['due']}" if "due" in data else ""
            print(f"  {name}: {data['seconds']:.0f} s real{extra}; {by_resource(data)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=60, help="simulated seconds a phase")
    parser.add_argument("--baseline", default="7436cd3", help="the code to compare with")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--nats", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--report", nargs=2, type=Path, metavar=("BASELINE", "NEW"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.serve is not None:
        serve(args.serve)
        return 0
    if args.report is not None:  # print two runs' saved results again
        old, new = (json.loads(path.read_text()) for path in args.report)
        print_report({"today": old, "new": new}, args.nodes, args.seconds)
        return 0
    if args.measure is not None:
        result = measure(args.measure, args.nats, args.nodes, args.seconds)
        args.out.write_text(json.dumps(result))
        return 0
    from resurge.local.nats_server import NatsServer

    with NatsServer(Path(tempfile.mkdtemp(prefix="kube-api-nats-"))) as nats:
        results: dict[str, dict[str, Any]] = {}
        with baseline_tree(args.baseline) as old:
            results[f"today ({args.baseline})"] = run_version(
                old, nats.url, args.nodes, args.seconds
            )
        results["new (this tree)"] = run_version(REPO, nats.url, args.nodes, args.seconds)
    print_report(results, args.nodes, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
