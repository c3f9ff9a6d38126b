"""The Kubernetes backend's pure mappings: Nodes to node records, worker groups to pods,
cordons to patches, job statuses to the status subresource and Events."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from resurge.cluster import WORKER_GROUP_ENV, NodeInfo, WorkerGroupSpec
from resurge.cluster.kubernetes.objects import (
    CORDON_REASON_ANNOTATION,
    CORDON_UNSCHEDULABLE_ANNOTATION,
    MONITOR_ANNOTATION,
    UNHEALTHY_TAINT,
    cordon_patch,
    group_of_pod,
    node_info,
    node_manifest,
    pod_manifest,
    pod_name,
    report_patch,
    uncordon_patch,
)
from resurge.cluster.kubernetes.status import event_manifests
from resurge.cluster.names import service_name, worker_hostname

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def kube_node(
    name: str = "gpu-1",
    gpus: int | None = 8,
    ready: str | None = "True",
    report: NodeInfo | None = None,
    **spec: Any,
) -> dict[str, Any]:
    node: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "a"}},
        "spec": spec,
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.9"}]},
    }
    if gpus is not None:
        node["status"]["allocatable"] = {"nvidia.com/gpu": str(gpus), "cpu": "64"}
    if ready is not None:
        node["status"]["conditions"] = [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": ready, "lastHeartbeatTime": "2026-12-03T11:59:50Z"},
        ]
    if report is not None:
        node["metadata"] = {**node["metadata"], **report_patch(None, report)["metadata"]}
        node["metadata"]["labels"] = {
            "topology.kubernetes.io/zone": "a",
            **{k: v for k, v in report.labels.items()},
        }
    return node


def report(slots: int = 8, healthy: bool = True, **labels: str) -> NodeInfo:
    return NodeInfo(name="gpu-1", slots=slots, healthy=healthy, labels=labels, heartbeat=NOW)


def test_a_ready_node_with_a_monitor_report_is_schedulable_with_its_gpus() -> None:
    info = node_info(kube_node(report=report(slots=8)))
    assert (info.name, info.slots, info.address) == ("gpu-1", 8, "10.0.0.9")
    assert info.healthy and info.schedulable and not info.cordoned
    assert info.heartbeat == NOW  # the monitor's, not the kubelet's
    assert info.labels["topology.kubernetes.io/zone"] == "a"


def test_slots_are_the_allocatable_gpus_else_the_monitors() -> None:
    assert node_info(kube_node(gpus=6, report=report(slots=8))).slots == 6  # plugin lost two
    assert node_info(kube_node(gpus=8, report=report(slots=1))).slots == 8  # --gpus 1 caps none
    assert node_info(kube_node(gpus=None, report=report(slots=4))).slots == 4  # no plugin
    assert node_info(kube_node(gpus=8)).slots == 8  # no monitor yet


def test_not_ready_or_an_unhealthy_gpu_makes_a_node_unhealthy() -> None:
    assert not node_info(kube_node(ready="False", report=report())).healthy
    assert not node_info(kube_node(ready="Unknown", report=report())).healthy
    assert not node_info(kube_node(report=report(healthy=False))).healthy
    assert node_info(kube_node(ready=None, report=report())).healthy  # no condition yet


def test_cordon_taints_and_keeps_other_taints_and_uncordon_undoes_it() -> None:
    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    node = kube_node(taints=[other])
    patch = cordon_patch(node, "XID 79 on GPU 3")
    assert patch["spec"]["unschedulable"] is True
    assert patch["spec"]["taints"] == [
        other,
        {"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"},
    ]
    assert patch["metadata"]["annotations"][CORDON_REASON_ANNOTATION] == "XID 79 on GPU 3"

    cordoned = kube_node(**patch["spec"])
    cordoned["metadata"]["annotations"] = patch["metadata"]["annotations"]
    info = node_info(cordoned)
    assert info.cordoned and not info.schedulable and info.cordon_reason == "XID 79 on GPU 3"

    undone = uncordon_patch(cordoned)
    assert undone["spec"] == {"unschedulable": None, "taints": [other]}
    assert undone["metadata"]["annotations"] == {
        CORDON_REASON_ANNOTATION: None,
        CORDON_UNSCHEDULABLE_ANNOTATION: None,
    }


def test_cordon_patches_hold_only_while_the_node_is_as_read() -> None:
    node = kube_node()
    node["metadata"]["resourceVersion"] = "41"
    assert cordon_patch(node, "XID 79")["metadata"]["resourceVersion"] == "41"
    assert uncordon_patch(node)["metadata"]["resourceVersion"] == "41"


def test_uncordon_keeps_a_cordon_set_by_hand_before_resurges() -> None:
    by_hand = kube_node(unschedulable=True)
    patch = cordon_patch(by_hand, "XID 79")
    assert CORDON_UNSCHEDULABLE_ANNOTATION not in patch["metadata"]["annotations"]
    cordoned = kube_node(**patch["spec"])
    cordoned["metadata"]["annotations"] = patch["metadata"]["annotations"]
    undone = uncordon_patch(cordoned)
    assert "unschedulable" not in undone["spec"]  # the merge patch leaves it as it is
    assert undone["spec"]["taints"] is None


def test_a_node_cordoned_by_hand_is_cordoned_without_a_reason() -> None:
    info = node_info(kube_node(unschedulable=True))
    assert info.cordoned and not info.healthy and info.cordon_reason == ""


def test_a_report_replaces_the_labels_the_monitor_added_before_and_no_others() -> None:
    before = kube_node(report=report(rack="r1", zone="a"))
    patch = report_patch(before, report(zone="b"))
    assert patch["metadata"]["labels"] == {"rack": None, "zone": "b"}
    written = json.loads(patch["metadata"]["annotations"][MONITOR_ANNOTATION])
    assert written["slots"] == 8 and written["labels"] == {"zone": "b"}


def test_a_node_registered_from_a_report_reads_back_as_reported() -> None:
    info = NodeInfo(name="n1", slots=4, address="10.1.1.1", labels={"zone": "a"}, heartbeat=NOW)
    back = node_info(node_manifest(info))
    assert back.model_dump() == info.model_dump()


GROUP = WorkerGroupSpec(
    job="llama",
    replica=2,
    node="gpu-7",
    nproc=4,
    command=["python", "train.py"],
    env={"A": "1"},
    incarnation=1,
)
ON_POD_NETWORK = GROUP.model_copy(update={"domain": "llama.default.svc"})

TRAINING_JOB: dict[str, Any] = {
    "apiVersion": "resurge.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": "llama", "namespace": "team", "uid": "u-1"},
    "spec": {
        "command": ["python", "train.py"],
        "image": "registry/train:1",
        "queue": "team-queue",
        "priorityClassName": "high",
        "template": {
            "metadata": {"labels": {"team": "nlp"}},
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                        "resources": {"limits": {"memory": "64Gi", "nvidia.com/gpu": 8}},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                ],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
            },
        },
    },
}

AGENT_ENV = {"RESURGE_NATS_URL": "nats://nats:4222", "RESURGE_CLUSTER": "kubernetes"}


def test_a_worker_groups_pod_is_pinned_labelled_owned_and_runs_the_agent() -> None:
    pod = pod_manifest(GROUP, TRAINING_JOB, AGENT_ENV, "resurge:latest")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == pod_name(GROUP)
    assert meta["labels"] == {
        "team": "nlp",
        "resurge.dev/job": "llama",
        "resurge.dev/replica": "2",
    }  # no queue label: the job is one Kueue workload, not one per pod (.queueing)
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "resurge.dev/v1alpha1",
            "kind": "TrainingJob",
            "name": "llama",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]
    }
    assert spec["priorityClassName"] == "high" and spec["restartPolicy"] == "OnFailure"
    assert spec["hostNetwork"] is True and spec["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {"name": "resurge-shm", "emptyDir": {"medium": "Memory"}},  # the node's memory
    ]
    assert spec["tolerations"] == [
        {"key": "gpu", "operator": "Exists"},  # the template's first: it wins for its taints
        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},  # 30 s + 30
    ]
    [container] = spec["containers"]
    assert container["name"] == "trainer" and container["image"] == "registry/train:1"
    assert container["command"] == ["resurge-node-agent", "launch"]
    assert container["resources"] == {
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "4"},
        "requests": {"nvidia.com/gpu": "4"},
    }
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["RESURGE_CLUSTER"] == "kubernetes"
    assert WorkerGroupSpec.model_validate_json(env[WORKER_GROUP_ENV]) == GROUP
    assert group_of_pod(pod) == GROUP


def test_dev_shm_is_memory_backed_unless_the_template_mounts_something_there() -> None:
    pod = pod_manifest(ON_POD_NETWORK, None, AGENT_ENV, "resurge:latest")
    [container] = pod["spec"]["containers"]
    assert {"name": "resurge-shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["spec"]["volumes"] == [{"name": "resurge-shm", "emptyDir": {"medium": "Memory"}}]
    own = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    template = {
        "spec": {
            "volumes": [own],
            "containers": [{"volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
        }
    }
    job = {"metadata": {"name": "j", "uid": "u"}, "spec": {"template": template}}
    pod = pod_manifest(ON_POD_NETWORK, job, AGENT_ENV, "resurge:latest")
    assert pod["spec"]["volumes"] == [own]  # the template's own, as it is
    assert pod["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "shm", "mountPath": "/dev/shm"}
    ]


def test_a_group_without_a_training_job_gets_the_default_image_and_no_owner() -> None:
    pod = pod_manifest(ON_POD_NETWORK, None, AGENT_ENV, "resurge:latest")
    assert "ownerReferences" not in pod["metadata"]
    assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]
    assert pod["spec"]["containers"][0]["image"] == "resurge:latest"
    assert "hostNetwork" not in pod["spec"]


def test_the_agent_gets_its_nats_user_from_a_secret_reference_only() -> None:
    template_env = [
        {"name": "RESURGE_NATS_PASSWORD", "value": "typed-into-the-job"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
    ]
    job = {**TRAINING_JOB, "spec": {"template": {"spec": {"containers": [{"env": template_env}]}}}}
    pod = pod_manifest(GROUP, job, AGENT_ENV, "resurge:latest", agent_secret="nats-agent")
    env = pod["spec"]["containers"][0]["env"]
    by_name = {e["name"]: e for e in env}
    assert [e["name"] for e in env].count("RESURGE_NATS_PASSWORD") == 1
    for name, key in (("RESURGE_NATS_USER", "user"), ("RESURGE_NATS_PASSWORD", "password")):
        assert by_name[name] == {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": "nats-agent", "key": key}},
        }
    assert by_name["NCCL_DEBUG"]["value"] == "INFO"
    # Without a Secret named, no user: the pods connect as before.
    plain = pod_manifest(GROUP, None, AGENT_ENV, "resurge:latest")
    assert not any(e["name"] == "RESURGE_NATS_USER" for e in plain["spec"]["containers"][0]["env"])


def test_a_pods_own_user_comes_from_its_secret_and_no_template_user_is_kept() -> None:
    template_env = [
        {"name": "RESURGE_NATS_USER", "value": "someone"},
        {"name": "RESURGE_NATS_CREDENTIALS", "value": "/mnt/other.creds"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
    ]
    job = {**TRAINING_JOB, "spec": {"template": {"spec": {"containers": [{"env": template_env}]}}}}
    pod = pod_manifest(GROUP, job, AGENT_ENV, "resurge:latest", creds_secret="pod-0-nats")
    env = pod["spec"]["containers"][0]["env"]
    by_name = {e["name"]: e for e in env}
    assert by_name["RESURGE_NATS_CREDS"] == {
        "name": "RESURGE_NATS_CREDS",
        "valueFrom": {"secretKeyRef": {"name": "pod-0-nats", "key": "creds"}},
    }
    # The template's own user settings would win over (or stand beside) the pod's.
    assert not {"RESURGE_NATS_USER", "RESURGE_NATS_CREDENTIALS"} & set(by_name)
    assert by_name["NCCL_DEBUG"]["value"] == "INFO"


def test_a_recreated_or_moved_group_gets_a_pod_of_another_name() -> None:
    names = {
        pod_name(GROUP),
        pod_name(GROUP.model_copy(update={"incarnation": 2})),
        pod_name(GROUP.model_copy(update={"node": "gpu-8"})),
    }
    assert len(names) == 3 and all(n.startswith("llama-2-") for n in names)
    assert group_of_pod({"metadata": {"name": "other"}}) is None


def running(generation: int, **extra: object) -> dict[str, object]:
    return {"name": "llama", "phase": "Running", "generation": generation, **extra}


def test_each_recovery_and_resize_is_one_event() -> None:
    recovery = {"level": "process", "reason": "crash", "seconds": None, "generation": 2}
    before: dict[str, Any] = running(1)
    after = running(2, lastRecovery=recovery)
    [recovered] = event_manifests(TRAINING_JOB, before, after)
    assert recovered["reason"] == "Recovered" and recovered["type"] == "Normal"
    assert recovered["involvedObject"]["uid"] == "u-1"
    assert recovered["metadata"]["namespace"] == "team"
    # The seconds filled in later are the same recovery: no second Event.
    filled = running(2, lastRecovery={**recovery, "seconds": 0.4})
    assert event_manifests(TRAINING_JOB, after, filled) == []

    resize = {"resize": "grow", "from": 2, "to": 4, "why": "free GPUs", "time": "t1"}
    [resized] = event_manifests(TRAINING_JOB, filled, {**filled, "lastResize": resize})
    assert resized["reason"] == "Resized" and "from 2 to 4" in resized["message"]

    failed: dict[str, object] = {"phase": "Failed", "message": "restart limit reached"}
    [ended] = event_manifests(TRAINING_JOB, filled, failed)
    assert (ended["reason"], ended["type"]) == ("Failed", "Warning")


def test_an_old_heartbeat_is_read_as_old() -> None:
    stale = report().model_copy(update={"heartbeat": NOW - timedelta(minutes=5)})
    assert not node_info(kube_node(report=stale)).alive(NOW, 15.0)


def test_a_groups_domain_decides_its_pods_network() -> None:
    """With a domain (its job is on the pod network): a hostname and the Service as
    subdomain; without (the host network): neither, and a DNS policy that still resolves
    the cluster's names, unless the template chose one."""
    pod = pod_manifest(ON_POD_NETWORK, TRAINING_JOB, AGENT_ENV, "resurge:latest")["spec"]
    assert (pod["hostname"], pod["subdomain"]) == (worker_hostname(GROUP), "llama")
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    assert pod_manifest(ON_POD_NETWORK.model_copy(update={"job": "llama-3.1"}), None, {}, "x")[
        "spec"
    ]["subdomain"] == service_name("llama-3.1")

    chosen = copy.deepcopy(TRAINING_JOB)
    chosen["spec"]["template"]["spec"].update(hostNetwork=True, dnsPolicy="Default")
    pod = pod_manifest(GROUP, chosen, AGENT_ENV, "resurge:latest")["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "Default"
    assert "hostname" not in pod and "subdomain" not in pod
    plain = pod_manifest(GROUP, None, AGENT_ENV, "resurge:latest")["spec"]
    assert plain["hostNetwork"] is True and plain["dnsPolicy"] == "ClusterFirstWithHostNet"
