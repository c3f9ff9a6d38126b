"""A queued TrainingJob is one Kueue workload: the controller creates its Workload and no
pod until Kueue admits it; the pods land within the admitted flavor's node labels; a
finished job's Workload is Finished, which lets the next one in. Against the API
emulator with Kueue's CRDs and the admission stand-in of tests/kubernetes/kueue.py (the
Workload lifecycle of https://kueue.sigs.k8s.io/docs/concepts/workload/), a real
nats-server and the controller in this process; pods are created, never run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

from resurge.cluster import ClusterBackend, WorkerGroupSpec
from resurge.events import JobSubmitted
from tests.collect import Events
from tests.kubernetes import helpers
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import Running, pods_of, until
from tests.kubernetes.kueue import KueueStandIn, running_kueue

GPU = "nvidia.com/gpu"
T = TypeVar("T")


@pytest.fixture
def kueue(kube_api_thread: KubeApi) -> Iterator[KueueStandIn]:
    with running_kueue(kube_api_thread) as stand_in:
        yield stand_in


def queue_objects(api: KubeApi, gpus: int, preemption: bool = False, stop: str = "None") -> None:
    """A ResourceFlavor ``a100`` (nodes labelled gpu=a100), a ClusterQueue with ``gpus``
    of it (lower priorities preempted within it where ``preemption``; its
    ``stopPolicy``), and the LocalQueue ``team-queue`` of the default namespace."""
    api.create(
        "resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "ResourceFlavor",
            "metadata": {"name": "a100"},
            "spec": {"nodeLabels": {"gpu": "a100"}},
        },
    )
    api.create(
        "clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "ClusterQueue",
            "metadata": {"name": "cluster"},
            "spec": {
                "namespaceSelector": {},
                "stopPolicy": stop,
                "preemption": {"withinClusterQueue": "LowerPriority" if preemption else "Never"},
                "resourceGroups": [
                    {
                        "coveredResources": [GPU],
                        "flavors": [
                            {"name": "a100", "resources": [{"name": GPU, "nominalQuota": gpus}]}
                        ],
                    }
                ],
            },
        },
    )
    api.create(
        "localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "LocalQueue",
            "metadata": {"name": "team-queue", "namespace": "default"},
            "spec": {"clusterQueue": "cluster"},
        },
    )


def queued_job(name: str, priority_class: str | None = None) -> dict[str, Any]:
    """Two replicas of two GPU processes, labelled for the LocalQueue ``team-queue``."""
    job = helpers.training_job(name, replicas={"min": 2, "max": 2}, accelerator=GPU)
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-queue"
    if priority_class is not None:
        job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority_class
    return job


def group(job: str, replica: int, node: str) -> WorkerGroupSpec:
    return WorkerGroupSpec(job=job, replica=replica, node=node, nproc=2, command=["python"])


def workloads(api: KubeApi) -> dict[str, dict[str, Any]]:
    """The Workloads of the default namespace by the TrainingJob that owns each."""
    return {
        w["metadata"]["ownerReferences"][0]["name"]: w for w in api.objects("workloads", "default")
    }


def admitted(workload: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Admitted" and c["status"] == "True"
        for c in (workload.get("status") or {}).get("conditions") or []
    )


def test_the_stand_in_admits_by_quota_in_priority_order(
    kube_api_thread: KubeApi, kueue: KueueStandIn
) -> None:
    """Kueue's documented lifecycle (https://kueue.sigs.k8s.io/docs/concepts/workload/,
    .../cluster_queue/#resource-groups): a Workload is admitted when its pod sets'
    requests fit the ClusterQueue's nominal quota, with status.admission and the
    QuotaReserved and Admitted conditions; higher spec.priority first; a Finished one
    holds no quota."""
    queue_objects(kube_api_thread, gpus=4)

    def workload(name: str, priority: int) -> dict[str, Any]:
        template = {"spec": {"containers": [{"name": "c", "resources": {"requests": {GPU: "2"}}}]}}
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "queueName": "team-queue",
                "priority": priority,
                "podSets": [{"name": "main", "count": 2, "template": template}],
            },
        }

    def run(em: Any) -> list[str]:
        em.create_object("workloads", workload("low", 1))
        em.create_object("workloads", workload("high", 5))
        kueue.schedule()
        return sorted(kueue.admitted())

    assert kube_api_thread.call(run) == ["high"]
    high = kube_api_thread.get("workloads", "high")
    [assignment] = high["status"]["admission"]["podSetAssignments"]
    assert assignment == {
        "name": "main",
        "flavors": {GPU: "a100"},
        "resourceUsage": {GPU: "4"},
        "count": 2,
    }
    finished = {
        "type": "Finished",
        "status": "True",
        "reason": "Succeeded",
        "message": "done",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    conditions = [*high["status"]["conditions"], finished]
    kube_api_thread.patch_status("workloads", "high", {"conditions": conditions})
    kube_api_thread.call(lambda _: kueue.schedule())
    assert sorted(kube_api_thread.call(lambda _: list(kueue.admitted()))) == ["high", "low"]


async def test_a_queued_job_is_one_workload_and_gets_no_pod_before_admission(
    kube_api_thread: KubeApi,
    kueue: KueueStandIn,
    backend: ClusterBackend,
    controller: Running,
) -> None:
    """Quota for one job of two: the second waits with no pod until the first finishes;
    each job's Workload asks for its replicas' GPUs at its WorkloadPriorityClass's value,
    and the admitted flavor's node labels are in its pods' nodeSelector."""
    for name in ("n1", "n2", "n3", "n4"):
        kube_api_thread.add_node(name, gpus=2, labels={"gpu": "a100"})
    queue_objects(kube_api_thread, gpus=4)
    kube_api_thread.create(
        "workloadpriorityclasses",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "prod"},
            "value": 1000,
        },
    )
    first = kube_api_thread.create("trainingjobs", queued_job("first", priority_class="prod"))
    await backend.create_worker_group(group("first", 0, "n1"))
    await backend.create_worker_group(group("first", 1, "n2"))
    pods = await until("first's two pods", lambda: len(pods_of(kube_api_thread, "first")) == 2)
    assert pods
    workload = workloads(kube_api_thread)["first"]
    assert workload["metadata"]["ownerReferences"][0]["uid"] == first["metadata"]["uid"]
    assert workload["spec"]["queueName"] == "team-queue"
    assert (workload["spec"]["priorityClassName"], workload["spec"]["priority"]) == ("prod", 1000)
    [podset] = workload["spec"]["podSets"]
    assert podset["count"] == 2
    assert podset["template"]["spec"]["containers"][0]["resources"]["requests"] == {GPU: "2"}
    for pod in pods_of(kube_api_thread, "first"):
        assert pod["spec"]["nodeSelector"] == {"gpu": "a100"}
        # One workload for the job: no pod carries the queue label Kueue's pod
        # integration would make a workload of its own.
        assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]

    kube_api_thread.create("trainingjobs", queued_job("second"))
    await backend.create_worker_group(group("second", 0, "n3"))
    await backend.create_worker_group(group("second", 1, "n4"))
    waiting = await until("second's Workload", lambda: workloads(kube_api_thread).get("second"))
    assert not admitted(waiting)
    reasons = await until(
        "WaitingForKueue",
        lambda: [
            e["reason"]
            for e in kube_api_thread.objects("events", "default")
            if e["involvedObject"]["name"] == "second" and e["reason"] == "WaitingForKueue"
        ],
    )
    assert reasons == ["WaitingForKueue"]
    assert pods_of(kube_api_thread, "second") == []

    kube_api_thread.patch_status("trainingjobs", "first", {"phase": "Succeeded"})
    await until("first's Workload Finished", lambda: _finished(workloads(kube_api_thread)["first"]))
    await until("second's two pods", lambda: len(pods_of(kube_api_thread, "second")) == 2)
    assert admitted(workloads(kube_api_thread)["second"])


def changes(values: list[T]) -> list[T]:
    """``values`` without repeats of the one before."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


def _finished(workload: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Finished" and c["status"] == "True"
        for c in (workload.get("status") or {}).get("conditions") or []
    )


def test_the_stand_in_preempts_lower_priority_within_the_cluster_queue(
    kube_api_thread: KubeApi, kueue: KueueStandIn
) -> None:
    """Kueue's preemption (https://kueue.sigs.k8s.io/docs/concepts/preemption/, with
    withinClusterQueue: LowerPriority): a Workload that does not fit evicts admitted ones
    of lower priority (Evicted and Preempted True, QuotaReserved and Admitted False, no
    admission) and is admitted in their place; the evicted one waits to be admitted
    again, which it is once the quota is free."""
    queue_objects(kube_api_thread, gpus=4, preemption=True)

    def workload(name: str, priority: int) -> dict[str, Any]:
        template = {"spec": {"containers": [{"name": "c", "resources": {"requests": {GPU: "2"}}}]}}
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "queueName": "team-queue",
                "priority": priority,
                "podSets": [{"name": "main", "count": 2, "template": template}],
            },
        }

    def run(em: Any) -> list[str]:
        em.create_object("workloads", workload("low", 1))
        kueue.schedule()
        em.create_object("workloads", workload("high", 5))
        kueue.schedule()  # evicts low
        kueue.schedule()  # admits high
        return sorted(kueue.admitted())

    assert kube_api_thread.call(run) == ["high"]
    low = kube_api_thread.get("workloads", "low")
    assert "admission" not in low["status"]
    states = {c["type"]: (c["status"], c["reason"]) for c in low["status"]["conditions"]}
    assert states["Evicted"] == ("True", "Preempted")
    assert states["Preempted"] == ("True", "InClusterQueue")
    assert states["QuotaReserved"][0] == states["Admitted"][0] == "False"
    kube_api_thread.call(lambda em: em.delete_object("workloads", "high", "default"))
    kube_api_thread.call(lambda _: kueue.schedule())
    assert kube_api_thread.call(lambda _: sorted(kueue.admitted())) == ["low"]


async def test_a_queued_job_is_held_until_admitted_and_again_when_evicted(
    kube_api_thread: KubeApi,
    kueue: KueueStandIn,
    backend: ClusterBackend,
    controller: Running,
    jobs: Events,
) -> None:
    """The job is submitted held (spec.suspend) while its Workload waits, so the scaler
    places nothing; admitted, it is submitted again unheld; evicted by Kueue's
    preemption, held again (the scaler then checkpoints and suspends it), and unheld
    when admitted again. The TrainingJob's own spec is never edited."""
    queue_objects(kube_api_thread, gpus=4, stop="Hold")  # admits nothing new
    kube_api_thread.create("trainingjobs", queued_job("llama"))

    def held() -> list[bool]:
        """Each change of the hold submitted (a submission may repeat the last one)."""
        return changes([e.spec.spec.suspend for e in jobs.of(JobSubmitted)])

    await jobs.wait_for(lambda _: held())
    assert held() == [True]
    assert jobs.of(JobSubmitted)[0].update is False
    go = {"spec": {"stopPolicy": "None"}}
    kube_api_thread.call(lambda em: em.patch_object("clusterqueues", "cluster", go))
    await jobs.wait_for(lambda _: held() == [True, False])
    assert jobs.of(JobSubmitted)[-1].update is True
    name = workloads(kube_api_thread)["llama"]["metadata"]["name"]
    kube_api_thread.call(lambda em: kueue.evict(name))
    await jobs.wait_for(lambda _: held()[:3] == [True, False, True])
    await jobs.wait_for(lambda _: held() == [True, False, True, False])  # admitted again
    assert kube_api_thread.get("trainingjobs", "llama")["spec"]["suspend"] is False


async def test_an_elastic_jobs_elastic_part_is_its_own_workload_preempted_first(
    kube_api_thread: KubeApi,
    kueue: KueueStandIn,
    backend: ClusterBackend,
    controller: Running,
    jobs: Events,
) -> None:
    """An elastic job (1 to 3 replicas) is a base Workload of 1 replica and, once that
    is admitted, an elastic one of 2: submitted held (unless the base is admitted by
    then), then at most 1 replica, then as written (3). A job of higher priority that
    needs the elastic part's quota preempts it (the more recently admitted of the
    job's, at one priority), not the base: the job is submitted again at most 1 replica
    (the scaler shrinks it), and back up to 3 once the preemptor has finished."""
    queue_objects(kube_api_thread, gpus=6, preemption=True)
    for name, value in (("low", 10), ("high", 1000)):
        kube_api_thread.create(
            "workloadpriorityclasses",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    elastic = queued_job("elastic", priority_class="low")
    elastic["spec"]["replicas"] = {"min": 1, "max": 3}
    kube_api_thread.create("trainingjobs", elastic)

    def sizes(job: str) -> list[int]:
        """Each change of the size submitted (0: held); a submission may repeat one."""
        return changes(
            [
                0 if e.spec.spec.suspend else e.spec.spec.replicas.upper
                for e in jobs.of(JobSubmitted)
                if e.job == job
            ]
        )

    await jobs.wait_for(lambda _: sizes("elastic")[-1:] == [3])
    # The stand-in may admit the base before the first submission: [1, 3].
    assert sizes("elastic") in ([0, 1, 3], [1, 3])
    before = sizes("elastic")
    parts = {
        w["metadata"]["labels"]["resurge.dev/kueue-part"]: w["spec"]["podSets"][0]["count"]
        for w in kube_api_thread.objects("workloads", "default")
    }
    assert parts == {"base": 1, "elastic": 2}

    urgent = queued_job("urgent", priority_class="high")
    urgent["spec"]["replicas"] = {"min": 1, "max": 1}
    kube_api_thread.create("trainingjobs", urgent)
    await jobs.wait_for(lambda _: sizes("elastic")[-1:] == [1])
    await jobs.wait_for(lambda _: sizes("urgent")[-1:] == [1])
    base = next(
        w
        for w in kube_api_thread.objects("workloads", "default")
        if w["metadata"]["labels"]["resurge.dev/kueue-part"] == "base"
        and w["metadata"]["ownerReferences"][0]["name"] == "elastic"
    )
    assert admitted(base), "the base of the preempted job stays admitted"
    kube_api_thread.patch_status("trainingjobs", "urgent", {"phase": "Succeeded"})
    await jobs.wait_for(lambda _: sizes("elastic")[-1:] == [3])
    assert sizes("elastic")[len(before) :] == [1, 3]
