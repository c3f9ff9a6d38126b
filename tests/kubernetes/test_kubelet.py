"""The process kubelet (kubelet.py), the end-to-end tests' stand-in for the kubelet and the
scheduler: it binds pinned pods, runs them as processes, reports their phase, restarts
them as their restartPolicy says and stops every process of a deleted pod."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import eventually
from tests.kubernetes.kubelet import ProcessKubelet, pod_processes


def pinned_pod(
    name: str, node: str, script: str, policy: str = "Never", **spec: Any
) -> dict[str, Any]:
    """A pod running ``sh -c SCRIPT``, pinned to ``node`` as resurge pins its pods."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": policy,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
            "containers": [
                {
                    "name": "main",
                    "image": "none",
                    "command": ["sh", "-c", script],
                    "env": [
                        {"name": "GREETING", "value": "hello"},
                        {
                            "name": "MY_NODE",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                        },
                    ],
                }
            ],
            **spec,
        },
    }


def phase(api: KubeApi, name: str) -> str | None:
    return (api.get("pods", name).get("status") or {}).get("phase")


def test_a_pinned_pod_is_bound_run_with_its_env_and_succeeds(
    kube_api_thread: KubeApi, process_kubelet: ProcessKubelet
) -> None:
    kube_api_thread.add_node("node-a")
    process_kubelet.serve("node-a")
    kube_api_thread.create("pods", pinned_pod("ok", "node-a", 'echo "$GREETING from $MY_NODE"'))
    eventually(lambda: phase(kube_api_thread, "ok") == "Succeeded", 20, "pod ok Succeeded")
    pod = kube_api_thread.get("pods", "ok")
    assert pod["spec"]["nodeName"] == "node-a", "bound as a scheduler would"
    [status] = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 0 and status["restartCount"] == 0
    assert "hello from node-a" in (process_kubelet.log_dir / "ok.log").read_text()


def test_on_failure_restarts_and_counts_and_never_fails_the_pod(
    kube_api_thread: KubeApi, process_kubelet: ProcessKubelet, tmp_path: Path
) -> None:
    kube_api_thread.add_node("node-a")
    process_kubelet.serve("node-a")
    flag = tmp_path / "ran-once"
    script = f"test -e {flag} && exit 0; touch {flag}; exit 3"
    kube_api_thread.create("pods", pinned_pod("flaky", "node-a", script, "OnFailure"))
    eventually(lambda: phase(kube_api_thread, "flaky") == "Succeeded", 20, "pod flaky Succeeded")
    [status] = kube_api_thread.get("pods", "flaky")["status"]["containerStatuses"]
    assert status["restartCount"] == 1
    run = process_kubelet.run_of("flaky")
    assert run is not None and run.exit_codes == [3, 0]

    kube_api_thread.create("pods", pinned_pod("broken", "node-a", "exit 4", "Never"))
    eventually(lambda: phase(kube_api_thread, "broken") == "Failed", 20, "pod broken Failed")


def test_a_deleted_pod_loses_every_process_even_ones_in_other_sessions(
    kube_api_thread: KubeApi, process_kubelet: ProcessKubelet
) -> None:
    kube_api_thread.add_node("node-a")
    process_kubelet.serve("node-a")
    # Ignores SIGTERM, and leaves a child in a session of its own: only SIGKILL after the
    # grace, and the pod's marker, end them.
    script = "trap '' TERM; setsid sleep 600 & sleep 600"
    body = pinned_pod("stubborn", "node-a", script, terminationGracePeriodSeconds=1)
    kube_api_thread.create("pods", body)
    uid = kube_api_thread.get("pods", "stubborn")["metadata"]["uid"]
    eventually(lambda: len(pod_processes(uid)) >= 3, 20, "sh and both sleeps running")
    kube_api_thread.delete("pods", "stubborn")
    eventually(lambda: not pod_processes(uid), 15, lambda: f"left: {pod_processes(uid)}")
    assert ("stubborn", uid) in process_kubelet.deleted


def test_pods_of_cordoned_or_foreign_nodes_are_not_run(
    kube_api_thread: KubeApi, process_kubelet: ProcessKubelet
) -> None:
    kube_api_thread.add_node("node-a")
    kube_api_thread.add_node("node-b")
    process_kubelet.serve("node-a")
    kube_api_thread.call(
        lambda em: em.patch_object("nodes", "node-a", {"spec": {"unschedulable": True}})
    )
    kube_api_thread.create("pods", pinned_pod("cordoned", "node-a", "exit 0"))
    kube_api_thread.create("pods", pinned_pod("elsewhere", "node-b", "exit 0"))

    def unschedulable() -> bool:
        conditions = (kube_api_thread.get("pods", "cordoned").get("status") or {}).get(
            "conditions"
        ) or []
        return any(c.get("reason") == "Unschedulable" for c in conditions)

    eventually(unschedulable, 20, "pod cordoned marked Unschedulable")
    assert "nodeName" not in kube_api_thread.get("pods", "cordoned")["spec"]
    assert process_kubelet.run_of("elsewhere") is None, "node-b is not this kubelet's"
    kube_api_thread.call(
        lambda em: em.patch_object("nodes", "node-a", {"spec": {"unschedulable": None}})
    )
    eventually(
        lambda: phase(kube_api_thread, "cordoned") == "Succeeded", 20, "runs once uncordoned"
    )


def test_a_pod_on_the_pod_network_runs_in_this_machines_network(
    kube_api_thread: KubeApi, process_kubelet: ProcessKubelet
) -> None:
    """What the kubelet leaves out (its docstring): no pod network, no cluster DNS. A pod
    with a hostname and subdomain runs like a host-network one, at its node's address."""
    kube_api_thread.add_node("node-a", address="127.0.0.1")
    process_kubelet.serve("node-a")
    body = pinned_pod("podnet", "node-a", 'echo "at $POD_IP"', hostname="p-0", subdomain="job")
    body["spec"]["containers"][0]["env"].append(
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    )
    kube_api_thread.create("pods", body)
    eventually(lambda: phase(kube_api_thread, "podnet") == "Succeeded", 20, "pod podnet Succeeded")
    status = kube_api_thread.get("pods", "podnet")["status"]
    assert status["podIP"] == status["hostIP"] == "127.0.0.1"
    assert "at 127.0.0.1" in (process_kubelet.log_dir / "podnet.log").read_text()


def _scheduled_condition(api: KubeApi, name: str) -> dict[str, Any] | None:
    conditions = (api.get("pods", name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), None)


def _unschedulable_message(api: KubeApi, name: str) -> str | None:
    condition = _scheduled_condition(api, name)
    if condition is None or condition.get("reason") != "Unschedulable":
        return None
    return str(condition.get("message"))


def _gpus(body: dict[str, Any], gpus: int) -> dict[str, Any]:
    body["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/gpu": str(gpus)},
        "limits": {"nvidia.com/gpu": str(gpus)},
    }
    return body


def test_a_pod_waits_while_another_teams_pod_holds_the_nodes_gpus(
    kube_api_thread: KubeApi, process_kubelet: ProcessKubelet
) -> None:
    """NodeResourcesFit over every pod on the node, resurge's or not ("Resource
    Management for Pods and Containers": the sum of the requests of the scheduled
    containers is less than the node's capacity; kubernetes.io/docs/concepts/
    configuration/manage-resources-containers/). A pod bound to a node that lacks room
    is refused by the kubelet's admission (phase Failed, reason OutOf<resource>)."""
    kube_api_thread.add_node("node-a", gpus=2)
    process_kubelet.serve("node-a")
    # Another team's pod, bound by the cluster's scheduler, holding both GPUs.
    theirs = _gpus(pinned_pod("theirs", "node-a", "sleep 600"), 2)
    del theirs["spec"]["affinity"]
    theirs["spec"]["nodeName"] = "node-a"
    kube_api_thread.create("pods", theirs)
    eventually(lambda: phase(kube_api_thread, "theirs") == "Running", 20, "pod theirs Running")
    kube_api_thread.create("pods", _gpus(pinned_pod("ours", "node-a", "exit 0"), 1))
    message = eventually(
        lambda: _unschedulable_message(kube_api_thread, "ours"), 20, "pod ours Unschedulable"
    )
    assert message == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    assert "nodeName" not in kube_api_thread.get("pods", "ours")["spec"]
    late = _gpus(pinned_pod("late", "node-a", "exit 0"), 1)
    del late["spec"]["affinity"]
    late["spec"]["nodeName"] = "node-a"
    kube_api_thread.create("pods", late)
    eventually(lambda: phase(kube_api_thread, "late") == "Failed", 20, "pod late refused")
    assert kube_api_thread.get("pods", "late")["status"]["reason"] == "OutOfnvidia.com/gpu"
    kube_api_thread.delete("pods", "theirs")
    eventually(lambda: phase(kube_api_thread, "ours") == "Succeeded", 20, "runs once freed")


def test_selector_affinity_and_taints_decide_where_a_pod_is_bound(
    kube_api_thread: KubeApi, process_kubelet: ProcessKubelet
) -> None:
    """NodeAffinity and TaintToleration ("Assigning Pods to Nodes", kubernetes.io/docs/
    concepts/scheduling-eviction/assign-pod-node/: nodeSelector and required node
    affinity both hold, terms ORed, expressions ANDed; "Taints and Tolerations",
    kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/): a pod not
    pinned to a node is bound to the one it matches; one that matches none waits with
    kube-scheduler's reasons, node by node."""
    kube_api_thread.add_node("gpu-a", labels={"pool": "train", "gen": "9"})
    kube_api_thread.add_node("gpu-b", labels={"pool": "train", "gen": "8"})
    kube_api_thread.add_node("cpu-c", labels={"pool": "serve"})
    kube_api_thread.call(
        lambda em: em.patch_object(
            "nodes",
            "gpu-b",
            {"spec": {"taints": [{"key": "team", "value": "vision", "effect": "NoSchedule"}]}},
        )
    )
    for node in ("gpu-a", "gpu-b", "cpu-c"):
        process_kubelet.serve(node)
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "pool", "operator": "In", "values": ["train"]},
                            {"key": "gen", "operator": "Lt", "values": ["9"]},
                        ]
                    }
                ]
            }
        }
    }
    body = pinned_pod("tolerant", "x", "exit 0", affinity=affinity)
    body["spec"]["tolerations"] = [{"key": "team", "operator": "Equal", "value": "vision"}]
    kube_api_thread.create("pods", body)
    eventually(lambda: phase(kube_api_thread, "tolerant") == "Succeeded", 20, "tolerant ran")
    assert kube_api_thread.get("pods", "tolerant")["spec"]["nodeName"] == "gpu-b"

    kube_api_thread.create("pods", pinned_pod("intolerant", "x", "exit 0", affinity=affinity))
    message = eventually(
        lambda: _unschedulable_message(kube_api_thread, "intolerant"), 20, "intolerant waits"
    )
    assert message == (
        "0/3 nodes are available: 1 node(s) had untolerated taint {team: vision}, "
        "2 node(s) didn't match Pod's node affinity/selector."
    )
    selected = pinned_pod("selected", "x", "exit 0", nodeSelector={"pool": "serve"})
    del selected["spec"]["affinity"]
    kube_api_thread.create("pods", selected)
    eventually(lambda: phase(kube_api_thread, "selected") == "Succeeded", 20, "selected ran")
    assert kube_api_thread.get("pods", "selected")["spec"]["nodeName"] == "cpu-c"


def test_a_pod_with_scheduling_gates_waits_until_they_are_removed(
    kube_api_thread: KubeApi, process_kubelet: ProcessKubelet
) -> None:
    """ "Pod Scheduling Readiness" (kubernetes.io/docs/concepts/scheduling-eviction/
    pod-scheduling-readiness/): a pod with schedulingGates is not scheduled; it shows
    PodScheduled False, reason SchedulingGated, until every gate is removed (Kueue's
    pod integration holds a pod that way until its workload is admitted)."""
    kube_api_thread.add_node("node-a")
    process_kubelet.serve("node-a")
    gate = [{"name": "kueue.x-k8s.io/admission"}]
    kube_api_thread.create("pods", pinned_pod("gated", "node-a", "exit 0", schedulingGates=gate))
    condition = eventually(
        lambda: (c := _scheduled_condition(kube_api_thread, "gated")) and c.get("reason"),
        20,
        "pod gated held back",
    )
    assert condition == "SchedulingGated"
    assert "nodeName" not in kube_api_thread.get("pods", "gated")["spec"]
    kube_api_thread.call(
        lambda em: em.patch_object("pods", "gated", {"spec": {"schedulingGates": None}})
    )
    eventually(lambda: phase(kube_api_thread, "gated") == "Succeeded", 20, "runs once ungated")


def test_a_secret_key_in_env_waits_for_its_secret_then_is_read(
    kube_api_thread: KubeApi, process_kubelet: ProcessKubelet
) -> None:
    """As a kubelet does ("Secrets" in the Kubernetes docs: a container whose env names a
    missing Secret does not start, CreateContainerConfigError, until the Secret exists)."""
    kube_api_thread.add_node("node-a")
    process_kubelet.serve("node-a")
    pod = pinned_pod("secretive", "node-a", 'echo "token=$TOKEN"')
    ref = {"secretKeyRef": {"name": "creds", "key": "token"}}
    pod["spec"]["containers"][0]["env"].append({"name": "TOKEN", "valueFrom": ref})
    kube_api_thread.create("pods", pod)

    def waiting() -> str | None:
        statuses = (kube_api_thread.get("pods", "secretive").get("status") or {}).get(
            "containerStatuses"
        ) or [{}]
        return ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason")

    eventually(lambda: waiting() == "CreateContainerConfigError", 20, "waiting for its Secret")
    assert process_kubelet.run_of("secretive").process is None  # type: ignore[union-attr]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds"},
        "data": {"token": base64.b64encode(b"s3cret").decode()},
    }
    kube_api_thread.create("secrets", secret)
    eventually(lambda: phase(kube_api_thread, "secretive") == "Succeeded", 20, "pod Succeeded")
    assert "token=s3cret" in (process_kubelet.log_dir / "secretive.log").read_text()
