"""End to end on the Kubernetes backend: resurge places a job the way the cluster's
scheduler would bind it, sharing the nodes with another team's pods.

Real parts as in test_e2e.py (nats-server, the services and monitors as processes, the
node agent in each pod, torch workers on gloo); the stand-ins are the API emulator and
the process kubelet, whose scheduler (tests/kubernetes/scheduler.py) binds a pod only
where every pod's requests fit, its nodeSelector and node affinity match and its
tolerations allow, as kube-scheduler does. The job runs a torchrun-style script that
never imports resurge (tests/e2e/workers/plain_ddp.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually_async

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
PLAIN_SCRIPT = REPO / "tests" / "e2e" / "workers" / "plain_ddp.py"
GPU = "nvidia.com/gpu"
HEALTHY = "sagemaker.amazonaws.com/node-health-status"
COMPUTE = "sagemaker.amazonaws.com/compute-type"
TRAIN = {HEALTHY: "Schedulable", COMPUTE: "ml.p5.48xlarge"}
# pl-0: 4 GPUs, 3 of them held by another team's pod; pl-1: 4 GPUs, but HyperPod's
# health check marked it Unschedulable; pl-2: 2 GPUs, free. Only pl-2 takes 2 GPUs.
UNHOLDABLE = "no node of this cluster can hold it: no node lets its pods on"
NODES = {"pl-0": (4, TRAIN), "pl-1": (4, {**TRAIN, HEALTHY: "Unschedulable"}), "pl-2": (2, TRAIN)}


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane on three labelled nodes and another team's pod holding 3 of
    pl-0's GPUs (in its own namespace, bound by the cluster's scheduler, running)."""
    plane = ControlPlane(kube_api_module, nats_url, tmp_path_factory.mktemp("k8s-place"))
    with plane.running({}):
        for name, (gpus, labels) in NODES.items():
            plane.add_node(name, gpus, wait=False)
            label(plane.api, name, labels)
        plane.wait_ready(90)
        plane.api.create("pods", other_teams_pod(), "vision")
        yield plane


def label(api: KubeApi, node: str, labels: dict[str, str]) -> None:
    """Add ``labels`` to Node ``node``, as an administrator (or HyperPod) would."""
    api.call(lambda em: em.patch_object("nodes", node, {"metadata": {"labels": labels}}))


def other_teams_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "vision-train", "namespace": "vision"},
        "spec": {
            "nodeName": "pl-0",
            "containers": [
                {
                    "name": "main",
                    "image": "vision:1",
                    "command": ["sleep", "600"],
                    "resources": {"limits": {GPU: "3"}},
                }
            ],
        },
    }


def plain_job(name: str, template_spec: dict[str, Any]) -> dict[str, Any]:
    """One replica of two ranks of the plain script, its pod template a HyperPod
    manifest's required node affinity (tests/data/hyperpod/llama3_1_8b-fsdp-hpto.yaml)
    plus ``template_spec``, on the host network (the process kubelet has no DNS)."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": HEALTHY, "operator": "In", "values": ["Schedulable"]},
                            {"key": COMPUTE, "operator": "In", "values": ["ml.p5.48xlarge"]},
                        ]
                    }
                ]
            }
        }
    }
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "command": ["python", str(PLAIN_SCRIPT), "--steps", "40", "--step-seconds", "0.05"],
            "workingDir": str(REPO),
            "nprocPerNode": 2,
            "replicas": {"min": 1, "max": 1},
            "recovery": {"stopGraceSeconds": 5},
            "template": {
                "spec": {
                    "hostNetwork": True,
                    "affinity": affinity,
                    "containers": [{"name": "pytorch", "resources": {"limits": {GPU: "2"}}}],
                    **template_spec,
                }
            },
        },
    }


def phase_of(plane: ControlPlane, job: str) -> str | None:
    return (plane.training_job(job).get("status") or {}).get("phase")


async def test_a_job_is_placed_around_another_teams_pod_keeping_its_hyperpod_affinity(
    plane: ControlPlane,
) -> None:
    job = "placed"
    plane.api.create("trainingjobs", plain_job(job, {}))

    def running() -> dict[str, Any] | None:
        pods = [p for p in plane.pods(job) if (p.get("status") or {}).get("phase") == "Running"]
        return pods[0] if pods else None

    pod = await eventually_async(
        running,
        120,
        lambda: (
            f"{job}'s pod running; status {plane.training_job(job).get('status')}; "
            f"pods {[(p['spec'].get('nodeName'), p.get('status')) for p in plane.pods(job)]}"
        ),
    )
    assert pod["spec"]["nodeName"] == "pl-2", "pl-0's GPUs are taken, pl-1 is unhealthy"
    required = pod["spec"]["affinity"]["nodeAffinity"]
    [term] = required["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {e["key"] for e in term["matchExpressions"]} == {HEALTHY, COMPUTE}
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["pl-2"]}]
    final = await eventually_async(
        lambda: phase_of(plane, job) in ("Succeeded", "Failed") and phase_of(plane, job),
        120,
        lambda: f"{job} finished; status {plane.training_job(job).get('status')}",
    )
    assert final == "Succeeded"
    plane.api.delete("trainingjobs", job)
    await eventually_async(lambda: not plane.pods(job), 60, f"{job}'s pods gone")


async def test_a_job_no_node_lets_on_waits_saying_why(plane: ControlPlane) -> None:
    job = "nowhere"
    plane.api.create("trainingjobs", plain_job(job, {"nodeSelector": {"pool": "batch"}}))

    def waiting() -> str | None:
        message = (plane.training_job(job).get("status") or {}).get("message") or ""
        return message if message.startswith(UNHOLDABLE) else None

    message = await eventually_async(
        waiting, 60, lambda: f"{job}'s status says why; {plane.training_job(job).get('status')}"
    )
    assert "pl-2: nodeSelector pool=batch (node has pool=<none>)" in message
    events = await eventually_async(
        lambda: [e for e in plane.events_of(job) if e["reason"] == "Waiting"],
        30,
        f"a Waiting Event on {job}",
    )
    assert events[0]["type"] == "Warning" and events[0]["message"] == message
    assert not plane.pods(job), "no pod for a job that fits nowhere"
    plane.api.delete("trainingjobs", job)
