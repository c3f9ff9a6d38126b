"""On Kubernetes a node's GPU monitoring is never silent: against the API emulator over
real HTTP with the official client and a real nats-server.

A real monitor process (``resurge-node-agent monitor`` as the DaemonSet runs it, no
``--gpus``) on this machine, which has no NVIDIA driver: it finds no NVML, simulates
nothing, and says so on its Node (condition ``ResurgeGPUHealth`` Unknown, reason
``NoNVML``, and a Warning Event), while the node's slots are its allocatable GPUs.
Before, it simulated one healthy GPU and the node offered one slot, silently.

Node conditions are the Node's ``status.conditions``, set through the ``nodes/status``
subresource and merged by ``type`` ("Node status", Conditions:
https://kubernetes.io/docs/reference/node/node-status/#condition; the NodeStatus API
reference: ``conditions`` has patch strategy merge on key ``type``).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from resurge.cluster import ClusterBackend, NodeInfo
from resurge.cluster.kubernetes.backend import KubernetesBackend
from resurge.cluster.kubernetes.objects import monitor_report, node_info
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import until
from tests.kubernetes.kubelet import process_environment

CONDITION = "ResurgeGPUHealth"


def gpu_condition(api: KubeApi, node: str) -> dict[str, Any] | None:
    conditions = api.get("nodes", node).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == CONDITION), None)


def node_events(api: KubeApi, node: str) -> list[dict[str, Any]]:
    return [
        e
        for e in api.objects("events")
        if e["involvedObject"].get("kind") == "Node" and e["involvedObject"]["name"] == node
    ]


async def test_a_monitor_without_nvml_says_so_on_its_node_and_offers_its_allocatable(
    kube_api_thread: KubeApi, settings: Settings, tmp_path: Path
) -> None:
    kube_api_thread.add_node("gpu-1", gpus=8)
    env = process_environment(
        {
            **kube_api_thread.env,
            "RESURGE_NATS_URL": settings.nats_url,
            "RESURGE_NAMESPACE": settings.namespace,
            "RESURGE_CLUSTER": "kubernetes",
            "RESURGE_LOG_FORMAT": "text",
        }
    )
    log = tmp_path / "monitor.log"
    with log.open("wb") as out:
        monitor = await asyncio.create_subprocess_exec(
            *("resurge-node-agent", "monitor", "--node", "gpu-1"),
            env=env,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        said = await until("the GPU condition", lambda: gpu_condition(kube_api_thread, "gpu-1"))
        assert (said["status"], said["reason"]) == ("Unknown", "NoNVML"), said
        assert "no XID or GPU health is watched" in said["message"], said
        assert said["lastTransitionTime"] and said["lastHeartbeatTime"], said
        [event] = await until("the Event", lambda: node_events(kube_api_thread, "gpu-1"))
        assert (event["type"], event["reason"]) == ("Warning", "NoNVML"), event
        node = kube_api_thread.get("nodes", "gpu-1")
        report = monitor_report(node)
        assert report is not None and report.slots == 0, "it simulated GPUs"
        assert node_info(node).slots == 8, "the node's allocatable GPUs"
        # The kubelet's Ready condition is still there: the patch merged by type.
        types = {c["type"] for c in node["status"]["conditions"]}
        assert types == {"Ready", CONDITION}, types
    finally:
        monitor.send_signal(signal.SIGTERM)
        await asyncio.wait_for(monitor.wait(), 30)
        print(log.read_text())


async def test_the_gpu_condition_follows_health_and_a_restarted_monitor_repeats_nothing(
    kube_api_thread: KubeApi, backend: ClusterBackend, bus: Bus, settings: Settings
) -> None:
    """NVML healthy is True (a Normal Event), a GPU out of use False (a Warning one),
    simulated GPUs Unknown; a report that changes nothing writes nothing, and a new
    monitor process (a new backend) that finds its Node saying it already writes no
    condition and records no Event."""
    kube_api_thread.add_node("gpu-1", gpus=8)

    def info(monitoring: str, healthy: bool = True) -> NodeInfo:
        return NodeInfo(name="gpu-1", slots=8, healthy=healthy, gpu_monitoring=monitoring)

    def writes() -> int:
        return kube_api_thread.requests().get(("patch", "nodes/status"), 0)

    await backend.report_node(info("nvml"))
    assert gpu_condition(kube_api_thread, "gpu-1") is not None
    said = gpu_condition(kube_api_thread, "gpu-1")
    assert said is not None and (said["status"], said["reason"]) == ("True", "NVMLHealthy")
    await backend.report_node(info("nvml", healthy=False))
    said = gpu_condition(kube_api_thread, "gpu-1")
    assert said is not None and (said["status"], said["reason"]) == ("False", "GPUUnhealthy")
    events = [(e["type"], e["reason"]) for e in node_events(kube_api_thread, "gpu-1")]
    assert sorted(events) == [("Normal", "NVMLHealthy"), ("Warning", "GPUUnhealthy")]

    before = writes()
    await backend.report_node(info("nvml", healthy=False))
    restarted = await KubernetesBackend.open(
        bus, settings.model_copy(update={"cluster": "kubernetes"})
    )
    await restarted.report_node(info("nvml", healthy=False))
    assert writes() == before and len(node_events(kube_api_thread, "gpu-1")) == 2

    await restarted.report_node(info("simulated"))
    said = gpu_condition(kube_api_thread, "gpu-1")
    assert said is not None and (said["status"], said["reason"]) == ("Unknown", "SimulatedGPUs")
    assert len(node_events(kube_api_thread, "gpu-1")) == 3
