"""Each TrainingJob's PodDisruptionBudget, made by the controller against the API emulator
over real HTTP: made with the job's first pod, raised as the job grows, refusing the
evictions of its running pods, gone with the job's worker groups; none where the
setting is off. (The emulator has no kubelet here: a pod is marked Running and Ready by
hand, as a kubelet reports it.)"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from resurge.cluster import WorkerGroupSpec
from resurge.cluster.kubernetes.backend import KubernetesBackend
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import Running, pods_of, training_job, until

NS = "default"


def group(job: str, replica: int, node: str) -> WorkerGroupSpec:
    return WorkerGroupSpec(job=job, replica=replica, node=node, nproc=1, command=["python"])


def budgets(api: KubeApi) -> list[dict[str, Any]]:
    return api.objects("poddisruptionbudgets", NS)


def evict(api: KubeApi, pod: str) -> int:
    core = k8s.CoreV1Api(api.api_client())
    body = k8s.V1Eviction(
        api_version="policy/v1", kind="Eviction", metadata=k8s.V1ObjectMeta(name=pod)
    )
    try:
        core.create_namespaced_pod_eviction(pod, NS, body)
    except ApiException as error:
        return int(error.status)
    return 201


async def test_a_jobs_budget_comes_with_its_first_pod_grows_with_it_and_refuses_evictions(
    kube_api_thread: KubeApi, backend: KubernetesBackend, controller: Running
) -> None:
    api = kube_api_thread
    for name in ("n1", "n2"):
        api.add_node(name, gpus=2)
    tj = api.create("trainingjobs", training_job("llama", replicas={"min": 1, "max": 2}))
    await backend.create_worker_group(group("llama", 0, "n1"))
    [pod] = await until("its pod", lambda: pods_of(api, "llama"))

    [budget] = budgets(api)
    assert budget["metadata"]["name"] == "llama"
    assert budget["metadata"]["ownerReferences"][0]["uid"] == tj["metadata"]["uid"]
    assert budget["spec"] == {
        "minAvailable": 1,
        "selector": {
            "matchLabels": {"resurge.dev/job": "llama"},
            "matchExpressions": [{"key": "resurge.dev/demand", "operator": "DoesNotExist"}],
        },
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    name = pod["metadata"]["name"]
    api.patch_status(
        "pods", name, {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    )
    assert evict(api, name) == 429
    assert [p["metadata"]["name"] for p in pods_of(api, "llama")] == [name]

    await backend.create_worker_group(group("llama", 1, "n2"))
    await until("two pods", lambda: len(pods_of(api, "llama")) == 2)
    assert [b["spec"]["minAvailable"] for b in budgets(api)] == [2]

    await backend.delete_worker_group("llama", 0, "n1")
    await backend.delete_worker_group("llama", 1, "n2")
    await until("no pods and no budget", lambda: not pods_of(api, "llama") and not budgets(api))


async def test_a_budget_goes_with_its_training_job(
    kube_api_thread: KubeApi, backend: KubernetesBackend, controller: Running
) -> None:
    api = kube_api_thread
    api.add_node("n1", gpus=2)
    api.create("trainingjobs", training_job("llama"))
    await backend.create_worker_group(group("llama", 0, "n1"))
    await until("its budget", lambda: budgets(api))
    api.delete("trainingjobs", "llama")  # the emulator collects the dependents
    await until("its pod and budget gone", lambda: not pods_of(api, "llama") and not budgets(api))


async def test_no_budget_where_the_setting_is_off(
    kube_api_thread: KubeApi, backend: KubernetesBackend
) -> None:
    api = kube_api_thread
    backend.settings = backend.settings.model_copy(update={"kube_disruption_budgets": False})
    running = Running(backend)
    running.start()
    try:
        api.add_node("n1", gpus=2)
        api.create("trainingjobs", training_job("llama"))
        await backend.create_worker_group(group("llama", 0, "n1"))
        [pod] = await until("its pod", lambda: pods_of(api, "llama"))
        assert not budgets(api)
        name = pod["metadata"]["name"]
        api.patch_status(
            "pods", name, {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        )
        assert evict(api, name) == 201
    finally:
        await running.stop()
