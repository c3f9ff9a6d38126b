"""How a node's GPU monitoring shows on its Node: a condition and Events. Pure functions.

A node monitor says how it watches the GPUs (:attr:`NodeInfo.gpu_monitoring`); on
Kubernetes that is never silent. The Node gets the condition ``ResurgeGPUHealth``
(``kubectl describe node`` lists it with the kubelet's), patched through the
``nodes/status`` subresource (a strategic merge: Node conditions merge by ``type``,
so the kubelet's and other controllers' stay):

====================  ========  ==================================================
monitoring, health    status    reason
====================  ========  ==================================================
NVML, all healthy     True      ``NVMLHealthy``
a GPU out of use      False     ``GPUUnhealthy`` (NVML or simulated)
simulated GPUs        Unknown   ``SimulatedGPUs``: XIDs only as injected
no NVML               Unknown   ``NoNVML``: no XID, no GPU health on this node
====================  ========  ==================================================

Each change of the condition's status or reason is also an Event on the Node, a
Warning unless the GPUs are watched and healthy.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from resurge.cluster.kubernetes.times import now_time

__all__ = [
    "GPU_CONDITION",
    "GpuCondition",
    "condition_patch",
    "gpu_condition",
    "node_condition",
    "node_event",
]

GPU_CONDITION = "ResurgeGPUHealth"
_REPORTER = "resurge-node-monitor"

Monitoring = Literal["nvml", "simulated", "none"]


class GpuCondition(dict[str, str]):
    """A Node condition's ``type``, ``status``, ``reason`` and ``message``."""

    @property
    def key(self) -> tuple[str, str]:
        """What an Event is recorded for a change of: status and reason."""
        return (self["status"], self["reason"])


def gpu_condition(monitoring: Monitoring, healthy: bool, gpus: int) -> GpuCondition:
    """The condition of a node whose monitor watches ``gpus`` GPUs by ``monitoring``,
    none of them out of use where ``healthy``."""
    if monitoring == "none":
        status, reason = "Unknown", "NoNVML"
        message = (
            "the resurge node monitor finds no NVML (no NVIDIA driver library in its "
            "container: the NVIDIA container runtime with NVIDIA_VISIBLE_DEVICES=all "
            "exposes it): no XID or GPU health is watched on this node, only its liveness"
        )
    elif not healthy:
        status, reason = "False", "GPUUnhealthy"
        message = "a GPU is out of use after an XID or fell off the bus (resurge events)"
        if monitoring == "simulated":
            message += "; the GPUs are simulated"
    elif monitoring == "simulated":
        status, reason = "Unknown", "SimulatedGPUs"
        message = (
            f"the resurge node monitor simulates {gpus} GPU(s) (--gpus, no NVML): XIDs "
            "come only from `resurge inject xid`; real GPU faults are not seen"
        )
    else:
        status, reason = "True", "NVMLHealthy"
        message = f"the resurge node monitor watches {gpus} GPU(s) through NVML: all healthy"
    return GpuCondition(type=GPU_CONDITION, status=status, reason=reason, message=message)


def node_condition(node: dict[str, Any] | None) -> GpuCondition | None:
    """The ``ResurgeGPUHealth`` condition ``node`` has; None where it has none."""
    status = (node or {}).get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for item in conditions if isinstance(conditions, list) else []:
        if isinstance(item, dict) and item.get("type") == GPU_CONDITION:
            return GpuCondition(
                {k: str(item.get(k) or "") for k in ("type", "status", "reason", "message")}
            )
    return None


def condition_patch(condition: GpuCondition) -> dict[str, Any]:
    """The strategic merge patch of ``nodes/status`` that sets ``condition``, stamped now
    (a change of status or reason: its transition too)."""
    now = now_time()
    return {
        "status": {
            "conditions": [{**condition, "lastHeartbeatTime": now, "lastTransitionTime": now}]
        }
    }


def node_event(node: str, namespace: str, condition: GpuCondition) -> dict[str, Any]:
    """A Kubernetes Event on Node ``node`` saying ``condition`` (in ``namespace``: an
    Event is namespaced, a Node is not; ``kubectl describe node`` finds it in any)."""
    now = now_time()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
        "reason": condition["reason"],
        "message": condition["message"],
        "type": "Normal" if condition["status"] == "True" else "Warning",
        "source": {"component": _REPORTER, "host": node},
        "reportingComponent": _REPORTER,
        "reportingInstance": node[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
