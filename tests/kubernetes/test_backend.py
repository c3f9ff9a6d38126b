"""The Kubernetes backend and its controller against the API emulator over real HTTP, with
the official client and a real nats-server. The emulator stands in for the API server
and lacks a scheduler and kubelets: pods here are created and deleted, never run."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from kubernetes import client as k8s

from resurge.cluster import ClusterBackend, WorkerGroupSpec, watching
from resurge.events import CapacityChanged, JobDeleted, JobSubmitted
from resurge.runtime.bus import Bus
from tests.collect import Events
from tests.contract.helpers import next_changes
from tests.kubernetes import helpers
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import Running, pods_of, until


def training_job(name: str, **spec: Any) -> dict[str, Any]:
    """Two replicas."""
    return helpers.training_job(name, **{"replicas": {"min": 2, "max": 2}, **spec})


def group(job: str, replica: int, node: str, incarnation: int = 0) -> WorkerGroupSpec:
    return WorkerGroupSpec(
        job=job,
        replica=replica,
        node=node,
        nproc=2,
        command=["python", "train.py"],
        incarnation=incarnation,
    )


async def test_a_training_job_is_submitted_once_and_a_deleted_one_deleted(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running, jobs: Events
) -> None:
    kube_api_thread.create("trainingjobs", training_job("llama"))
    submitted = await jobs.wait_for(lambda items: jobs.of(JobSubmitted))
    assert [e.job for e in submitted] == ["llama"]
    assert submitted[0].spec.spec.nproc_per_node == 2
    assert submitted[0].spec.metadata.labels == {"team": "nlp"}
    await until(
        "the submitted generation recorded in the status",
        lambda: (
            kube_api_thread.get("trainingjobs", "llama")
            .get("status", {})
            .get("submittedGeneration")
            == 1
        ),
    )

    # A second controller (the scaler restarted) lists it again and submits nothing.
    again = asyncio.create_task(backend.reconcile())
    kube_api_thread.create("trainingjobs", training_job("marker"))
    await jobs.wait_for(lambda items: sum(isinstance(e, JobSubmitted) for e in items) >= 2)
    again.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await again
    names = [e.job for e in jobs.of(JobSubmitted)]
    assert names.count("llama") == 1 and names.count("marker") >= 1

    kube_api_thread.delete("trainingjobs", "llama")
    deleted = await jobs.wait_for(lambda items: jobs.of(JobDeleted))
    assert [e.job for e in deleted] == ["llama"]


async def test_an_invalid_training_job_fails_naming_the_field(
    kube_api_thread: KubeApi, controller: Running, jobs: Events
) -> None:
    # One the CRD's schema lets through (a rule between two fields) and parsing refuses.
    replicas = {"min": 2, "max": 4, "step": 2, "discrete": [2, 4]}
    kube_api_thread.create("trainingjobs", training_job("bad", replicas=replicas))
    status = await until(
        "the job marked Failed",
        lambda: kube_api_thread.get("trainingjobs", "bad").get("status", {}).get("phase"),
    )
    assert status == "Failed"
    message = kube_api_thread.get("trainingjobs", "bad")["status"]["message"]
    assert "spec.replicas" in message and "replicas.step and replicas.discrete" in message, message
    [event] = await until(
        "an InvalidSpec Event", lambda: kube_api_thread.objects("events", "default")
    )
    assert (event["reason"], event["type"]) == ("InvalidSpec", "Warning")
    assert event["involvedObject"]["name"] == "bad"
    assert not jobs.of(JobSubmitted)


async def test_worker_groups_become_pods_that_come_back_and_go(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running
) -> None:
    for name in ("n1", "n2"):
        kube_api_thread.add_node(name, gpus=4)
    tj = kube_api_thread.create("trainingjobs", training_job("llama"))
    await backend.create_worker_group(group("llama", 0, "n1"))
    await backend.create_worker_group(group("llama", 1, "n2"))
    pods = await until(
        "two pods",
        lambda: len(pods_of(kube_api_thread, "llama")) == 2 and pods_of(kube_api_thread, "llama"),
    )
    by_replica = {p["metadata"]["labels"]["resurge.dev/replica"]: p for p in pods}
    first = by_replica["0"]
    assert first["metadata"]["ownerReferences"][0]["uid"] == tj["metadata"]["uid"]
    container = first["spec"]["containers"][0]
    assert container["image"] == "registry/train:1"
    assert container["command"] == ["resurge-node-agent", "launch"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert WorkerGroupSpec.model_validate_json(env["RESURGE_WORKER_GROUP"]) == group(
        "llama", 0, "n1"
    )
    assert env["RESURGE_CLUSTER"] == "kubernetes"
    terms = first["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchFields"][0]["values"] == ["n1"]
    [service] = kube_api_thread.objects("services", "default")
    assert service["metadata"]["name"] == "llama" and service["spec"]["clusterIP"] == "None"

    # Deleted behind the backend's back: the controller makes it again.
    lost = first["metadata"]["name"]
    kube_api_thread.delete("pods", lost)
    again = await until(
        "the pod recreated",
        lambda: [p for p in pods_of(kube_api_thread, "llama") if p["metadata"]["name"] == lost],
    )
    assert again[0]["metadata"]["uid"] != first["metadata"]["uid"]

    # A pod-level restart (new incarnation) replaces the pod; a deleted group's pod goes.
    await backend.create_worker_group(group("llama", 0, "n1", incarnation=1))
    await backend.delete_worker_group("llama", 1, "n2")
    await until(
        "one pod of incarnation 1",
        lambda: (
            [
                WorkerGroupSpec.model_validate_json(
                    p["metadata"]["annotations"]["resurge.dev/worker-group"]
                ).incarnation
                for p in pods_of(kube_api_thread, "llama")
            ]
            == [1]
        ),
    )
    await backend.delete_worker_group("llama", 0, "n1")
    await until(
        "no pods and no Service",
        lambda: (
            not pods_of(kube_api_thread, "llama")
            and not kube_api_thread.objects("services", "default")
        ),
    )


async def test_deleting_the_training_job_takes_its_pods(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running
) -> None:
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await backend.create_worker_group(group("llama", 0, "n1"))
    await until("its pod", lambda: pods_of(kube_api_thread, "llama"))
    kube_api_thread.delete("trainingjobs", "llama")  # the emulator collects the dependents
    await until("its pod gone", lambda: not pods_of(kube_api_thread, "llama"))
    assert not kube_api_thread.objects("services", "default")


async def test_a_node_turning_not_ready_is_a_capacity_event(
    kube_api_thread: KubeApi, bus: Bus, controller: Running
) -> None:
    capacity = Events()
    await bus.subscribe(bus.subjects.all("capacity"), capacity.add)
    kube_api_thread.add_node("n1", gpus=4)
    await kube_api_thread.wait_for_watch("nodes")
    kube_api_thread.set_ready("n1", False)
    [lost] = await capacity.wait_for(
        lambda items: [e for e in items if isinstance(e, CapacityChanged)]
    )
    assert (lost.node, lost.healthy, lost.slots_free, lost.slots_total) == ("n1", False, 0, 4)
    kube_api_thread.set_ready("n1", True)
    back = await capacity.wait_for(lambda items: len(items) >= 2 and items[-1])
    assert isinstance(back, CapacityChanged) and back.healthy and back.slots_free == 4


async def test_a_cordon_is_a_taint_and_unschedulable_and_uncordon_clears_both(
    kube_api_thread: KubeApi, backend: ClusterBackend
) -> None:
    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    kube_api_thread.add_node("n1", gpus=4)
    core = k8s.CoreV1Api(kube_api_thread.api_client())
    await asyncio.to_thread(core.patch_node, "n1", {"spec": {"taints": [other]}})
    await backend.cordon("n1", reason="XID 79 on GPU 3")
    node = kube_api_thread.get("nodes", "n1")
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [
        other,
        {"key": "resurge.dev/unhealthy", "value": "true", "effect": "NoSchedule"},
    ]
    assert node["metadata"]["annotations"]["resurge.dev/cordon-reason"] == "XID 79 on GPU 3"
    await backend.uncordon("n1")
    node = kube_api_thread.get("nodes", "n1")
    assert not node["spec"].get("unschedulable") and node["spec"]["taints"] == [other]


async def test_status_goes_through_the_subresource_with_one_event_per_recovery(
    kube_api_thread: KubeApi, backend: ClusterBackend
) -> None:
    kube_api_thread.create("trainingjobs", training_job("llama"))
    recovery = {"level": "process", "reason": "worker crashed", "seconds": None, "generation": 2}
    status: dict[str, object] = {
        "name": "llama",
        "phase": "Running",
        "generation": 2,
        "replicas": {"current": 2, "target": 2},
        "restarts": {"process": 1},
        "lastRecovery": recovery,
    }
    await backend.write_job_status("llama", status)
    await backend.write_job_status(
        "llama", {**status, "lastRecovery": {**recovery, "seconds": 0.3}}
    )
    stored = kube_api_thread.get("trainingjobs", "llama")
    assert stored["status"]["phase"] == "Running" and stored["status"]["restartCount"] == 1
    assert stored["status"]["lastRecovery"]["seconds"] == 0.3
    assert stored["spec"]["nprocPerNode"] == 2  # the spec is untouched
    holding = [c["type"] for c in stored["status"]["conditions"] if c["status"] == "True"]
    assert holding == ["Created", "Running"]
    events = kube_api_thread.objects("events", "default")
    assert [e["reason"] for e in events] == ["Recovered"]
    assert await backend.read_job_status("llama") == {
        **status,
        "lastRecovery": {**recovery, "seconds": 0.3},
    }
    # A job with no TrainingJob (submitted with `resurge submit`) keeps its status too.
    await backend.write_job_status("cli-job", {"phase": "Pending"})
    assert await backend.read_job_status("cli-job") == {"phase": "Pending"}


async def test_a_broken_watch_resumes_and_a_410_relists_without_missing_or_repeating(
    kube_api_thread: KubeApi, backend: ClusterBackend
) -> None:
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.add_node("n2", gpus=4)
    async with watching(backend) as changes:
        first = await next_changes(changes, 2)
        assert {c.node for c in first} == {"n1", "n2"}
        await kube_api_thread.wait_for_watch("nodes")

        assert kube_api_thread.break_watches() >= 1
        kube_api_thread.add_node("n3", gpus=4)  # while the watch is down, or just after
        [added] = await next_changes(changes, 1)
        assert (added.kind, added.node, added.deleted) == ("node", "n3", False)

        # Compacted history: the watch's version is gone, it must list again.
        await kube_api_thread.wait_for_watch("nodes")
        kube_api_thread.compact()
        kube_api_thread.break_watches()
        kube_api_thread.delete("nodes", "n2")
        kube_api_thread.set_ready("n1", False)
        after = await next_changes(changes, 2)
        seen = {(c.node, c.deleted) for c in after}
        assert seen == {("n2", True), ("n1", False)}, after
        [n1] = [c for c in after if c.node == "n1"]
        assert n1.node_info is not None and not n1.node_info.healthy

        # Nothing more: n3 is not reported again after the relist, n2 not deleted twice;
        # only n1 may change once more (NotReady is two writes: the condition, the taint).
        kube_api_thread.add_node("n4", gpus=4)
        rest = [await next_changes(changes, 1)]
        while rest[-1][0].node != "n4":
            rest.append(await next_changes(changes, 1))
        assert {c.node for [c] in rest} <= {"n1", "n4"}, rest


async def test_kueue_admission_is_read_back_from_the_scheduling_gate(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running
) -> None:
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", training_job("llama"))
    await backend.create_worker_group(group("llama", 0, "n1"))
    [pod] = await until("its pod", lambda: pods_of(kube_api_thread, "llama"))
    name = pod["metadata"]["name"]
    core = k8s.CoreV1Api(kube_api_thread.api_client())
    merge = "application/merge-patch+json"

    def reasons() -> list[str]:
        return [e["reason"] for e in kube_api_thread.objects("events", "default")]

    # Kueue's webhook gates the pod until the workload is admitted (no Kueue here: the
    # test sets and lifts the gate as Kueue would).
    gate = {"spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}}
    await asyncio.to_thread(core.patch_namespaced_pod, name, "default", gate, _content_type=merge)
    await until("WaitingForKueue", lambda: "WaitingForKueue" in reasons())
    lifted = {"spec": {"schedulingGates": None}}
    await asyncio.to_thread(core.patch_namespaced_pod, name, "default", lifted, _content_type=merge)
    await until("AdmittedByKueue", lambda: "AdmittedByKueue" in reasons())
    assert reasons().count("WaitingForKueue") == 1
    assert [p["metadata"]["name"] for p in pods_of(kube_api_thread, "llama")] == [name]
