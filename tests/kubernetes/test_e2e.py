"""End to end on the Kubernetes backend, without a cluster: TrainingJobs applied to the API
emulator are trained, recovered, moved off a broken node, grown and deleted.

Real parts: nats-server, the detector, restarter and scaler (running the Kubernetes
controller) and one node monitor per fake node as processes, the official client over
HTTP, the node agent in each pod, torch workers forked from its fork server (gloo on
CPU), DCP checkpoints, the ``resurge`` CLI. Stand-ins: the API server (kmock's emulator,
tests/kubernetes/emulator.py) and the kubelet and scheduler (the process kubelet,
tests/kubernetes/kubelet.py), which runs each pod's container as local processes.

One control plane serves the module (two nodes of 2 GPUs, ``kn-0`` and ``kn-1``); each
test runs its own job and deletes it at the end, so the next finds the nodes free. The
XID test leaves its node cordoned and the elastic test adds a node, so those two come
last; the elastic test sizes its job from the free GPUs it finds.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import watch as k8s_watch

from resurge.cluster.kubernetes.objects import node_info
from resurge.events import (
    Assign,
    Event,
    ProcessExited,
    ProcessStarted,
    Progress,
    RecoveryFinished,
    RecoveryLevel,
    RendezvousPassed,
    ScaleDecided,
)
from resurge.runtime.bus import Bus
from tests.collect import Events
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually_async

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "kubernetes" / "ddp-job.yaml"
NODES = {"kn-0": 2, "kn-1": 2}
EVERY = 10  # steps between checkpoints
# The raw kinds a test follows (log lines left out: too many).
RAW_KINDS = (
    "process_started", "process_exited", "progress", "checkpoint_saved", "agent_state",
    "rendezvous_passed",
)  # fmt: skip
# A torchrun-style DDP script that never imports resurge (tests/e2e/workers/plain_ddp.py).
PLAIN_SCRIPT = REPO / "tests" / "e2e" / "workers" / "plain_ddp.py"


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """The module's control plane (tests/kubernetes/e2e_cluster.py), ready; stopped after,
    and checked to have left no pod process behind."""
    plane = ControlPlane(kube_api_module, nats_url, tmp_path_factory.mktemp("k8s-e2e"))
    with plane.running(NODES):
        yield plane


@pytest.fixture
async def events(plane: ControlPlane) -> AsyncIterator[Events]:
    """Every control-plane event and the jobs' raw events but log lines, from now on."""
    collected = Events()
    bus = await Bus.connect(plane.settings, "e2e-test")
    for family in ("fault", "cmd", "action", "job", "capacity"):
        await bus.subscribe(bus.subjects.all(family), collected.add)
    for kind in RAW_KINDS:
        await bus.subscribe(bus.subjects.raw(None, kind, None), collected.add)
    await bus.nc.flush()
    try:
        yield collected
    finally:
        await bus.close()


@pytest.fixture
async def jobs(plane: ControlPlane) -> AsyncIterator[list[str]]:
    """The names of the TrainingJobs a test creates; each one still there at teardown is
    deleted and its pods awaited gone, so a failed test leaves the nodes free too."""
    names: list[str] = []
    yield names
    for name in names:
        if any(tj["metadata"]["name"] == name for tj in plane.api.objects("trainingjobs")):
            await delete_job(plane, name)


def create(plane: ControlPlane, jobs: list[str], body: dict[str, Any]) -> dict[str, Any]:
    """Apply TrainingJob ``body`` to the emulator (as ``kubectl apply`` would create it)."""
    jobs.append(body["metadata"]["name"])
    return plane.api.create("trainingjobs", body)


# -- helpers --------------------------------------------------------------------------------


def ddp_job(
    name: str,
    tmp_path: Path,
    steps: int,
    *,
    nproc: int = 1,
    replicas: dict[str, int] | None = None,
    step_seconds: float = 0.05,
    **spec: Any,
) -> dict[str, Any]:
    """examples/kubernetes/ddp-job.yaml, made small: ``steps`` steps, a checkpoint every
    :data:`EVERY` into ``tmp_path``, this repository as the working directory, a global
    batch of 120 (it splits evenly over 1 to 6 ranks), on the host network."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["name"] = name
    job = body["spec"]
    job.pop("image")  # the process kubelet runs no images
    job["workingDir"] = str(REPO)
    job["command"] = [
        "python", "examples/ddp/train.py", "--steps", str(steps),
        "--checkpoint-every", str(EVERY), "--step-seconds", str(step_seconds),
        "--global-batch", "120", "--micro-batch", "2", "--log-every", "10",
    ]  # fmt: skip
    job["env"].append({"name": "RESURGE_CHECKPOINT_DIR", "value": str(tmp_path / "ckpt")})
    job["nprocPerNode"] = nproc
    job["replicas"] = replicas or {"min": 2, "max": 2}
    job["recovery"] = {"stopGraceSeconds": 5}
    # On the host network: the process kubelet has no cluster DNS, so a pod's DNS name
    # (MASTER_ADDR on the pod network) resolves nowhere here; a node's address does.
    job["template"] = {"spec": {"hostNetwork": True}}
    job.update(spec)
    return body


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    [container] = pod["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def status(plane: ControlPlane, job: str) -> dict[str, Any]:
    return dict(plane.training_job(job).get("status") or {})


def status_if(
    plane: ControlPlane, job: str, test: Callable[[dict[str, Any]], bool]
) -> dict[str, Any] | None:
    """The TrainingJob's status if ``test`` holds for it, else None."""
    now = status(plane, job)
    return now if test(now) else None


def steps_of(items: list[Event], job: str, generation: int | None = None) -> int:
    """The highest step ``job`` reported (in ``generation``, if given)."""
    return max(
        (
            e.step
            for e in items
            if isinstance(e, Progress)
            and e.job == job
            and (generation is None or e.generation == generation)
        ),
        default=0,
    )


def status_history(api: KubeApi, job: str, since: str) -> list[dict[str, Any]]:
    """Every status TrainingJob ``job`` has had after resourceVersion ``since``, in order,
    as ``kubectl get tj -w`` would have shown them (a watch from that version)."""
    client = api.api_client()
    try:
        from kubernetes import client as k8s

        stream = k8s_watch.Watch().stream(  # type: ignore[no-untyped-call]
            k8s.CustomObjectsApi(client).list_namespaced_custom_object,
            "resurge.dev", "v1alpha1", "default", "trainingjobs",
            field_selector=f"metadata.name={job}", resource_version=since,
            timeout_seconds=1, deserialize=False,
        )  # fmt: skip
        return [dict(e["object"].get("status") or {}) for e in stream if e["type"] == "MODIFIED"]
    finally:
        client.close()


def pods_of(plane: ControlPlane, job: str, phase: str | None = "Running") -> list[dict[str, Any]]:
    return [
        p for p in plane.pods(job) if phase is None or (p.get("status") or {}).get("phase") == phase
    ]


async def delete_job(plane: ControlPlane, job: str) -> list[dict[str, Any]]:
    """Delete TrainingJob ``job``; return its pods as they were, once every one is gone
    from the emulator, every process of theirs has ended and the TrainingJob is gone too
    (its finalizer removed: a test's teardown must not find it still being deleted)."""
    before = plane.pods(job)
    plane.api.delete("trainingjobs", job)
    await eventually_async(
        lambda: not plane.pods(job), 60, lambda: f"pods of {job} left: {pod_names(plane, job)}"
    )
    kubelet = plane.kubelet
    assert kubelet is not None
    runs = [
        r
        for r in kubelet.runs.values()
        if r.pod["metadata"]["labels"].get("resurge.dev/job") == job
    ]
    await eventually_async(
        lambda: not any(r.pids() for r in runs),
        60,
        lambda: f"processes of {job}'s pods left: {[r.pids() for r in runs]}",
    )
    # and the TrainingJob itself, once the controller removed its finalizer
    await eventually_async(
        lambda: not any(t["metadata"]["name"] == job for t in plane.api.objects("trainingjobs")),
        60,
        lambda: f"TrainingJob {job} still there: the controller did not remove its finalizer",
    )
    return before


async def event_recorded(plane: ControlPlane, job: str, reason: str) -> dict[str, Any]:
    """The Kubernetes Event ``reason`` on TrainingJob ``job``, once there is one (the
    backend records Events after the status patch that shows why)."""
    found = await eventually_async(
        lambda: [e for e in plane.events_of(job) if e["reason"] == reason],
        30,
        lambda: f"a {reason} Event on {job}; Events: {[e['reason'] for e in plane.events_of(job)]}",
    )
    return found[0]


def where(plane: ControlPlane, job: str) -> list[tuple[str, str | None, str | None]]:
    """Each pod of ``job``: its name, node and phase."""
    return [
        (p["metadata"]["name"], p["spec"].get("nodeName"), (p.get("status") or {}).get("phase"))
        for p in plane.pods(job)
    ]


def pod_names(plane: ControlPlane, job: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in plane.pods(job))


def free_gpus(plane: ControlPlane) -> int:
    """GPUs on schedulable, healthy nodes with no job's pod on them (the module's jobs
    are gone by the time a test calls it, so this is every healthy node's GPUs)."""
    busy = {
        (p.get("spec") or {}).get("nodeName")
        for p in plane.api.objects("pods", "default")
        if (p.get("status") or {}).get("phase") in ("Pending", "Running")
    }
    return sum(
        info.slots
        for node in plane.api.objects("nodes")
        if (info := node_info(node)).healthy and info.name not in busy
    )


# -- tests ----------------------------------------------------------------------------------


async def test_a_training_job_trains_the_ddp_example_in_pods_with_status_and_events(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job, steps = "ddp-train", 30
    created = create(plane, jobs, ddp_job(job, tmp_path, steps))
    uid, since = created["metadata"]["uid"], created["metadata"]["resourceVersion"]

    pods = await eventually_async(
        lambda: running if len(running := pods_of(plane, job)) == 2 else None,
        90,
        lambda: f"2 Running pods of {job}; have {pod_names(plane, job)}",
    )
    assert sorted(p["metadata"]["labels"]["resurge.dev/replica"] for p in pods) == ["0", "1"]
    for pod in pods:
        name = pod["metadata"]["name"]
        assert pod["metadata"]["labels"]["resurge.dev/job"] == job, name
        [owner] = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("TrainingJob", job, uid), owner
        [container] = pod["spec"]["containers"]
        assert container["command"] == ["resurge-node-agent", "launch"], name
        env = env_of(pod)
        group = json.loads(env["RESURGE_WORKER_GROUP"])
        assert (group["job"], str(group["replica"])) == (
            job, pod["metadata"]["labels"]["resurge.dev/replica"],
        ), name  # fmt: skip
        assert group["node"] == pod["spec"]["nodeName"] in NODES, (group, name)
        assert env["RESURGE_NATS_URL"] == plane.nats_url, name
        assert env["RESURGE_NAMESPACE"] == plane.namespace, name
        assert env["RESURGE_CLUSTER"] == "kubernetes", name
        [term] = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert term["matchFields"][0]["values"] == [group["node"]], name
        assert pod["spec"]["hostNetwork"] is True and "hostname" not in pod["spec"], name
    assigned = await events.wait_for(
        lambda items: [e for e in items if isinstance(e, Assign) and e.job == job], 30
    )
    assert {a.master_addr for a in assigned} == {"127.0.0.1"}, "the nodes' address"
    service = plane.api.get("services", job)
    assert service["spec"]["clusterIP"] == "None", service
    assert service["spec"]["selector"] == {"resurge.dev/job": job}, service
    assert service["metadata"]["ownerReferences"][0]["uid"] == uid, service

    await events.wait_for(lambda items: steps_of(items, job) == steps, 90)
    final = await eventually_async(
        lambda: status_if(plane, job, lambda s: s.get("phase") == "Succeeded"),
        60,
        lambda: f"{job} Succeeded; status {status(plane, job)}",
    )
    assert final["latestCheckpoint"]["step"] == steps, final
    assert final["completionTime"] and final["startTime"], final
    history = status_history(plane.api, job, since)
    assert any(
        s.get("phase") == "Running" and (s.get("latestCheckpoint") or {}).get("step", 0) >= EVERY
        for s in history
    ), f"no Running status with a checkpoint among {[s.get('phase') for s in history]}"
    await event_recorded(plane, job, "Succeeded")
    assert not any(isinstance(e, RecoveryFinished) for e in events.items), "nothing broke"
    await delete_job(plane, job)


async def test_a_sigkilled_worker_is_recovered_at_the_process_rung_in_the_same_pod(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job = "ddp-kill"
    one_pod = {"min": 1, "max": 1}
    create(plane, jobs, ddp_job(job, tmp_path, 2000, nproc=2, replicas=one_pod))
    await events.wait_for(lambda items: steps_of(items, job, 0) > EVERY, 120)
    [pod] = pods_of(plane, job)
    pods = {pod["metadata"]["name"]: pod["metadata"]["uid"]}
    kubelet = plane.kubelet
    assert kubelet is not None
    run = kubelet.run_of(pod["metadata"]["name"])
    assert run is not None and run.process is not None
    agent = run.process.pid

    # The worker of local rank 1, found through the pid its agent reported: it must be
    # one of the pod's processes (forked from the pod's fork server, in a session of its own).
    victim = next(
        e for e in events.items
        if isinstance(e, ProcessStarted) and e.job == job and e.generation == 0
        and e.local_rank == 1
    )  # fmt: skip
    assert victim.pid in run.pids(), f"worker {victim.pid} is not among the pod's processes"
    assert victim.pid != agent
    os.kill(victim.pid, signal.SIGKILL)

    recovered = await events.wait_for(
        lambda items: next(
            (e for e in items if isinstance(e, RecoveryFinished) and e.job == job), None
        ),
        90,
    )
    assert recovered.level is RecoveryLevel.PROCESS, recovered
    exits = [e for e in events.items if isinstance(e, ProcessExited) and e.pid == victim.pid]
    assert exits and exits[0].signal == "SIGKILL", exits
    await events.wait_for(lambda items: steps_of(items, job, recovered.generation) > 0, 90)

    recovered_status = await eventually_async(
        lambda: status_if(plane, job, lambda s: bool(s.get("lastRecovery"))),
        30,
        lambda: f"lastRecovery in {job}'s status {status(plane, job)}",
    )
    assert recovered_status["restarts"].get("process", 0) >= 1, recovered_status
    assert recovered_status["lastRecovery"]["level"] == "process", recovered_status
    assert recovered_status["restartCount"] >= 1, recovered_status
    await event_recorded(plane, job, "Recovered")
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in plane.pods(job)}
    assert now == pods, "the pods were kept: same names, same uids"
    assert not [d for d in kubelet.deleted if d[0] in pods], "no pod of the job was deleted"
    assert run.restarts == 0 and run.process.pid == agent, "the container was not restarted"
    restarted = [
        e for e in events.items
        if isinstance(e, ProcessStarted) and e.job == job and e.generation == recovered.generation
    ]  # fmt: skip
    assert restarted and all(e.pid in run.pids() for e in restarted), (
        "the new workers run in the same pod"
    )
    await delete_job(plane, job)


async def test_a_plain_torchrun_script_in_pods_recovers_a_killed_rank_and_succeeds(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    """What most users run: an unmodified torchrun-style script, which never imports
    resurge and reports no progress. Its only sign of life is the rendezvous its pod's
    agent hosts; a rank SIGKILLed in one pod of two is restarted at the process rung,
    and the script runs to the end."""
    job = "plain-kill"
    body = ddp_job(job, tmp_path, 0, nproc=2)
    body["spec"]["command"] = [
        "python", str(PLAIN_SCRIPT), "--steps", "300", "--step-seconds", "0.05",
    ]  # fmt: skip
    create(plane, jobs, body)

    def passed(generation: int) -> Callable[[list[Event]], list[Event]]:
        return lambda items: [
            e for e in items
            if isinstance(e, RendezvousPassed) and e.job == job and e.generation == generation
        ]  # fmt: skip

    await events.wait_for(passed(0), 120)
    victim = next(
        e for e in events.items
        if isinstance(e, ProcessStarted) and e.job == job and e.generation == 0 and e.rank == 1
    )  # fmt: skip
    os.kill(victim.pid, signal.SIGKILL)

    recovered = await events.wait_for(
        lambda items: next(
            (e for e in items if isinstance(e, RecoveryFinished) and e.job == job), None
        ),
        90,
    )
    assert recovered.level is RecoveryLevel.PROCESS, recovered
    await events.wait_for(passed(recovered.generation), 60)
    final = await eventually_async(
        lambda: status_if(plane, job, lambda s: s.get("phase") in ("Succeeded", "Failed")),
        120,
        lambda: f"{job} finished; status {status(plane, job)}",
    )
    assert final["phase"] == "Succeeded", final
    assert final["restarts"] == {"process": 1}, final
    await delete_job(plane, job)


async def test_deleting_the_training_job_removes_its_pods_and_service(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job = "ddp-delete"
    create(plane, jobs, ddp_job(job, tmp_path, 2000))
    # Both pods' workers started: each pod has its agent, fork server and a worker.
    await events.wait_for(
        lambda items: (
            {e.replica for e in items if isinstance(e, ProcessStarted) and e.job == job} == {0, 1}
        ),
        120,
    )
    kubelet = plane.kubelet
    assert kubelet is not None
    runs = {p["metadata"]["name"]: kubelet.run_of(p["metadata"]["name"]) for p in plane.pods(job)}
    assert len(runs) == 2 and all(r is not None and r.pids() for r in runs.values()), runs
    seen_runs = set(kubelet.runs)

    gone = await delete_job(plane, job)
    assert sorted(p["metadata"]["name"] for p in gone) == sorted(runs)
    with pytest.raises(Exception, match=r"404|Not Found"):
        plane.api.get("services", job)
    assert {name for name, _ in kubelet.deleted} >= set(runs)
    recreated = [
        r.name for uid, r in kubelet.runs.items()
        if uid not in seen_runs and r.pod["metadata"]["labels"].get("resurge.dev/job") == job
    ]  # fmt: skip
    assert not recreated, f"pods created for the deleted job: {recreated}"


async def test_a_job_on_the_pod_network_rendezvouses_at_replica_0s_pod_dns_name(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    """The default: each pod a DNS name through the job's headless Service ("DNS for
    Services and Pods", Pod's hostname and subdomain fields,
    https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/), and
    MASTER_ADDR replica 0's. The process kubelet has no cluster DNS: the agents wait for
    the name to resolve (and would start the workers after MASTER_RESOLVE_SECONDS), so the
    job is deleted before it trains."""
    job = "pod-net.v1"  # a DNS subdomain, no DNS label: the Service's name is derived
    body = ddp_job(job, tmp_path, 2000)
    del body["spec"]["template"]
    create(plane, jobs, body)
    pods = await eventually_async(
        lambda: running if len(running := pods_of(plane, job)) == 2 else None,
        90,
        lambda: f"2 Running pods of {job}; have {pod_names(plane, job)}",
    )
    service = plane.api.objects("services", "default")
    [subdomain] = [
        s["metadata"]["name"] for s in service if s["spec"]["selector"] == {"resurge.dev/job": job}
    ]
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", subdomain), subdomain
    names = {}
    for pod in pods:
        spec = pod["spec"]
        assert "hostNetwork" not in spec and spec["subdomain"] == subdomain, spec
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", spec["hostname"]), spec
        replica = int(pod["metadata"]["labels"]["resurge.dev/replica"])
        names[replica] = f"{spec['hostname']}.{subdomain}.default.svc"
    assigned = await events.wait_for(
        lambda items: [e for e in items if isinstance(e, Assign) and e.job == job], 30
    )
    assert {a.master_addr for a in assigned} == {names[0]}
    [first] = [
        p["metadata"]["name"] for p in pods if names[0].startswith(p["spec"]["hostname"] + ".")
    ]
    log = plane.pod_dir / f"{first}.log"
    await eventually_async(
        lambda: f"waiting for MASTER_ADDR {names[0]} to resolve" in log.read_text(),
        30,
        lambda: f"the agent waiting for {names[0]}; its log: {log.read_text()[-2000:]}",
    )
    await delete_job(plane, job)


async def test_a_fatal_xid_cordons_and_taints_the_node_and_the_pod_moves(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job = "ddp-xid"
    create(plane, jobs, ddp_job(job, tmp_path, 2000, nproc=2, replicas={"min": 1, "max": 1}))
    await events.wait_for(lambda items: steps_of(items, job, 0) > EVERY, 120)
    [pod] = pods_of(plane, job)
    broken = pod["spec"]["nodeName"]
    [other] = set(NODES) - {broken}

    plane.cli("inject", "xid", "--node", broken, "--gpu", "0", "--code", "79")

    def cordoned() -> dict[str, Any] | None:
        node = plane.api.get("nodes", broken)
        taints = node["spec"].get("taints") or []
        ok = node["spec"].get("unschedulable") and any(
            t.get("key") == "resurge.dev/unhealthy" and t.get("effect") == "NoSchedule"
            for t in taints
        )
        return node if ok else None

    node = await eventually_async(
        cordoned,
        60,
        lambda: f"{broken} cordoned and tainted: {plane.api.get('nodes', broken)['spec']}",
    )
    assert "79" in node["metadata"]["annotations"].get("resurge.dev/cordon-reason", ""), node
    moved = await eventually_async(
        lambda: [p for p in pods_of(plane, job) if p["spec"].get("nodeName") == other],
        90,
        lambda: f"{job}'s pod Running on {other}: {where(plane, job)}",
    )
    assert moved[0]["metadata"]["name"] != pod["metadata"]["name"], "a new pod for the new node"
    await eventually_async(
        lambda: not any(p["metadata"]["uid"] == pod["metadata"]["uid"] for p in plane.pods(job)),
        60,
        f"the pod on {broken} deleted",
    )
    assigned = await events.wait_for(
        lambda items: next(
            (e for e in items if isinstance(e, Assign) and e.job == job and e.generation > 0), None
        ),
        60,
    )
    await events.wait_for(lambda items: steps_of(items, job, assigned.generation) > 0, 90)
    assert [slot.node for slot in assigned.rank_table] == [other], assigned.rank_table
    recovered = await events.wait_for(
        lambda items: next(
            (e for e in items if isinstance(e, RecoveryFinished) and e.job == job), None
        ),
        60,
    )
    assert recovered.level is RecoveryLevel.NODE, recovered
    await eventually_async(
        lambda: status_if(plane, job, lambda s: s["restarts"].get("node", 0) >= 1),
        30,
        lambda: f"a node restart in {job}'s status {status(plane, job)}",
    )
    await delete_job(plane, job)


async def test_an_elastic_job_grows_onto_a_node_added_to_the_cluster(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job = "ddp-grow"
    # A replica is a whole node (2 GPUs): as many as the free nodes hold, then one more.
    before = free_gpus(plane) // 2
    assert before >= 1, "the module's earlier jobs left no free node"
    body = ddp_job(
        job, tmp_path, 4000, nproc=2, replicas={"min": 1, "max": before + 1},
        elastic={"cooldownSeconds": 1, "scaleUpSnoozeSeconds": 0},
    )  # fmt: skip
    create(plane, jobs, body)
    await events.wait_for(lambda items: steps_of(items, job) > 0, 120)
    first = [e for e in events.items if isinstance(e, Assign) and e.job == job]
    assert first and first[-1].world_size == 2 * before, f"it fills the free nodes: {first}"

    plane.add_node("kn-new", gpus=2)

    decided = await events.wait_for(
        lambda items: next(
            (e for e in items if isinstance(e, ScaleDecided) and e.job == job), None
        ),
        120,
    )
    assert (decided.resize, decided.from_replicas, decided.to_replicas) == (
        "grow", before, before + 1,
    ), decided  # fmt: skip
    grown = await events.wait_for(
        lambda items: next(
            (
                e for e in items
                if isinstance(e, Assign) and e.job == job and e.world_size == 2 * (before + 1)
            ),
            None,
        ),
        90,
    )  # fmt: skip
    assert "kn-new" in [slot.node for slot in grown.rank_table], grown.rank_table
    await events.wait_for(lambda items: steps_of(items, job, grown.generation) > 0, 120)
    on_new = [p for p in pods_of(plane, job) if p["spec"].get("nodeName") == "kn-new"]
    assert len(on_new) == 1, where(plane, job)
    resized = await eventually_async(
        lambda: status_if(plane, job, lambda s: bool(s.get("lastResize"))),
        30,
        lambda: f"lastResize in {status(plane, job)}",
    )
    assert resized["lastResize"]["resize"] == "grow", resized
    assert resized["replicas"] == {"current": before + 1, "target": before + 1}, resized
    await event_recorded(plane, job, "Resized")
    await delete_job(plane, job)
