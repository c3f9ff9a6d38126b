"""The accelerator is a setting, against the API emulator over real HTTP with the official
client and a real nats-server: the pods the controller creates request the job's
accelerator (none for a CPU-only job), and a job whose accelerator is not the one the
installation counts slots in gets no pod and says why.

The emulator lacks a scheduler and kubelets: pods here are created, never run.
"""

from __future__ import annotations

from typing import Any

from resurge.cluster import ClusterBackend, WorkerGroupSpec
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import Running, pods_of, training_job, until


def group(job: str) -> WorkerGroupSpec:
    return WorkerGroupSpec(job=job, replica=0, node="n1", nproc=2, command=["python"])


def limits(**resources: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", "resources": {"limits": resources}}]}}


def conditions(api: KubeApi, name: str) -> dict[str, dict[str, Any]]:
    status = api.get("trainingjobs", name).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


async def test_pods_request_the_jobs_accelerator_and_a_cpu_job_none(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running
) -> None:
    """Before, every pod requested nvidia.com/gpu, a CPU-only job's too."""
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", training_job("cpu"))
    kube_api_thread.create(
        "trainingjobs", training_job("gpu", template=limits(**{"nvidia.com/gpu": 8}))
    )
    await backend.create_worker_group(group("cpu"))
    await backend.create_worker_group(group("gpu"))
    [cpu] = await until("the CPU job's pod", lambda: pods_of(kube_api_thread, "cpu"))
    [gpu] = await until("the GPU job's pod", lambda: pods_of(kube_api_thread, "gpu"))
    assert not cpu["spec"]["containers"][0].get("resources"), cpu["spec"]["containers"][0]
    assert gpu["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "2"},
        "requests": {"nvidia.com/gpu": "2"},
    }


async def test_a_job_of_another_accelerator_than_the_installations_gets_no_pod(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running
) -> None:
    """An AMD job on an installation counting nvidia.com/gpu (RESURGE_KUBE_ACCELERATOR):
    its slots would be counted in GPUs it does not request. It gets the ``PodsRefused``
    condition (a metav1.Condition, "Typical status properties" of the API conventions:
    https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md)
    and a Warning Event naming both resources; a job of the installation's accelerator
    beside it runs."""
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", training_job("amd", accelerator="amd.com/gpu"))
    kube_api_thread.create("trainingjobs", training_job("nv", accelerator="nvidia.com/gpu"))
    await backend.create_worker_group(group("amd"))
    await backend.create_worker_group(group("nv"))
    refused = await until(
        "PodsRefused", lambda: conditions(kube_api_thread, "amd").get("PodsRefused")
    )
    assert refused["status"] == "True", refused
    assert "amd.com/gpu" in refused["message"] and "RESURGE_KUBE_ACCELERATOR" in refused["message"]
    [event] = [
        e
        for e in kube_api_thread.objects("events", "default")
        if e["reason"] == "FailedCreatePod" and e["involvedObject"]["name"] == "amd"
    ]
    assert event["type"] == "Warning" and "nvidia.com/gpu" in event["message"], event
    await until("the nvidia job's pod", lambda: pods_of(kube_api_thread, "nv"))
    assert not pods_of(kube_api_thread, "amd")
