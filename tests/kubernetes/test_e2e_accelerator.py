"""End to end on the Kubernetes backend: jobs whose templates ask for GPUs run on a node
whose monitor runs as the DaemonSet runs it.

The node advertises 4 allocatable ``nvidia.com/gpu`` (as a device plugin would) and its
monitor has no ``--gpus``; this machine has no NVIDIA driver, so the monitor finds no
NVML. Before, such a monitor simulated one healthy GPU, the node offered one slot, and
a job of 2 per node waited for ever; now the node offers its 4 allocatable GPUs, says
on its Node that nothing watches them (``ResurgeGPUHealth`` ``NoNVML``), and two jobs of
2 GPUs each, one a plain torchrun-style script that never imports resurge and one the
resurge DDP example, run beside each other to the end, each pod asking for its 2.

Real parts: nats-server, the detector, restarter and scaler, the node monitor, the
official client over HTTP, the node agent in each pod, torch workers (gloo on CPU).
Stand-ins: the API server (tests/kubernetes/emulator.py) and the kubelet and scheduler
(tests/kubernetes/kubelet.py), whose scheduler binds a pod only where its requests fit
the node's allocatable.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from resurge.cluster.kubernetes.objects import monitor_report, node_info
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually_async

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "kubernetes" / "ddp-job.yaml"
# A torchrun-style DDP script that never imports resurge.
PLAIN_SCRIPT = REPO / "tests" / "e2e" / "workers" / "plain_ddp.py"
NODE = "acc-0"
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    plane = ControlPlane(kube_api_module, nats_url, tmp_path_factory.mktemp("k8s-accel"))
    with plane.running({}):
        plane.add_node(NODE, gpus=4, simulate=False)
        yield plane


def gpu_job(name: str, command: list[str], tmp_path: Path) -> dict[str, Any]:
    """examples/kubernetes/ddp-job.yaml as one replica of 2 workers whose template asks
    for 8 GPUs, as a HyperPod manifest's would (resurge asks for 2, one per worker), on
    the host network (the process kubelet has no cluster DNS)."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["metadata"]["name"] = name
    spec = body["spec"]
    spec.pop("image")  # the process kubelet runs no images
    spec["workingDir"] = str(REPO)
    spec["command"] = command
    spec["env"].append({"name": "RESURGE_CHECKPOINT_DIR", "value": str(tmp_path / name)})
    spec["nprocPerNode"] = 2
    spec["replicas"] = {"min": 1, "max": 1}
    spec["recovery"] = {"stopGraceSeconds": 5}
    trainer = {"name": "trainer", "resources": {"limits": {GPU: 2}}}
    spec["template"] = {"spec": {"hostNetwork": True, "containers": [trainer]}}
    return body


def phase(plane: ControlPlane, job: str) -> str | None:
    return (plane.training_job(job).get("status") or {}).get("phase")


def finished(plane: ControlPlane, job: str) -> str | None:
    """The job's phase once it is Succeeded or Failed, else None."""
    now = phase(plane, job)
    return now if now in ("Succeeded", "Failed") else None


def what(plane: ControlPlane, job: str) -> str:
    pods = [p.get("status") for p in plane.pods(job)]
    return f"{job} finished; phase {phase(plane, job)}, pods {pods}"


async def test_jobs_of_two_gpus_each_run_on_a_node_whose_monitor_has_no_nvml(
    plane: ControlPlane, tmp_path: Path
) -> None:
    plain = ["python", str(PLAIN_SCRIPT), "--steps", "60", "--step-seconds", "0.05"]
    example = [
        "python", "examples/ddp/train.py", "--steps", "30", "--checkpoint-every", "10",
        "--step-seconds", "0.05", "--global-batch", "120", "--micro-batch", "2",
    ]  # fmt: skip
    jobs = {"plain-gpu": plain, "resurge-gpu": example}
    for name, command in jobs.items():
        plane.api.create("trainingjobs", gpu_job(name, command, tmp_path))
    for name in jobs:
        done = await eventually_async(
            partial(finished, plane, name), 180, partial(what, plane, name)
        )
        assert done == "Succeeded", name
        # The pod as the kubelet ran it (a finished job's pods are deleted).
        assert plane.kubelet is not None
        [pod] = [
            run.pod
            for run in plane.kubelet.runs.values()
            if run.pod["metadata"]["labels"].get("resurge.dev/job") == name
        ]
        [container] = pod["spec"]["containers"]
        assert container["resources"] == {"limits": {GPU: "2"}, "requests": {GPU: "2"}}
        assert pod["spec"]["nodeName"] == NODE

    node = plane.api.get("nodes", NODE)
    report = monitor_report(node)
    assert report is not None and report.slots == 0, "the monitor simulated GPUs"
    assert node_info(node).slots == 4, "the node's allocatable GPUs"
    [said] = [c for c in node["status"]["conditions"] if c["type"] == "ResurgeGPUHealth"]
    assert (said["status"], said["reason"]) == ("Unknown", "NoNVML"), said
