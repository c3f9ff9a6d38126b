"""Placement that coexists with the cluster: the Kubernetes backend, against the API
emulator over real HTTP, counts what other teams' pods take of a node and offers a job
only the nodes its template's nodeSelector, node affinity and tolerations let its pods
on; the pod the controller makes for the placement keeps the template's terms. Each pod
is checked with the process kubelet's scheduler stand-in (tests/kubernetes/scheduler.py,
written from the Kubernetes docs apart from resurge's matcher): kube-scheduler would
bind it where resurge placed it."""

from __future__ import annotations

from typing import Any

from resurge.cluster import NodeInfo
from resurge.cluster.kubernetes.backend import KubernetesBackend
from resurge.cluster.kubernetes.demand import wants_demand_pods
from resurge.control.decisions.admission import new_record, place, why_waiting
from resurge.control.decisions.worker_groups import worker_groups
from resurge.control.state.records import JobRecord
from resurge.control.views.cluster_snapshot import ClusterReads, read_snapshot
from resurge.jobspec import parse_job
from tests.kubernetes import helpers
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import Running, pods_of, until
from tests.kubernetes.kubelet import ProcessKubelet
from tests.kubernetes.scheduler import feasibility

GPU = "nvidia.com/gpu"
HEALTHY = "sagemaker.amazonaws.com/node-health-status"
COMPUTE = "sagemaker.amazonaws.com/compute-type"
TRAIN = {"pool": "train", HEALTHY: "Schedulable", COMPUTE: "ml.p5.48xlarge"}

# A HyperPod manifest's required node affinity (tests/data/hyperpod/
# llama3_1_8b-fsdp-hpto.yaml) and a nodeSelector of the team's pool.
TEMPLATE: dict[str, Any] = {
    "spec": {
        "nodeSelector": {"pool": "train"},
        "affinity": {
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
        },
        "containers": [{"name": "pytorch", "resources": {"limits": {GPU: "2"}}}],
    }
}


class Records:
    """The job records a snapshot reads (a JobStore's ``all``)."""

    def __init__(self, *records: JobRecord) -> None:
        self.records = list(records)

    async def all(self) -> list[JobRecord]:
        return self.records


def other_teams_pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod of another team, in its own namespace, bound to ``node`` by the cluster's
    scheduler, holding ``gpus`` GPUs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "vision"},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "main", "image": "vision:1", "resources": {"limits": {GPU: str(gpus)}}}
            ],
        },
    }


async def cluster(api: KubeApi, backend: KubernetesBackend) -> None:
    """Five nodes, each reported live by its monitor: node-a (4 GPUs, 3 held by another
    team), node-b (2 GPUs, free), and three larger ones this job's template keeps its
    pods off: node-c (HyperPod's health label says Unschedulable), node-d (tainted for
    another team), node-e (another pool)."""
    api.add_node("node-a", gpus=4, labels=TRAIN)
    api.add_node("node-b", gpus=2, labels=TRAIN)
    api.add_node("node-c", gpus=8, labels={**TRAIN, HEALTHY: "Unschedulable"})
    api.add_node("node-d", gpus=8, labels=TRAIN)
    api.add_node("node-e", gpus=8, labels={**TRAIN, "pool": "serve"})
    taint = {"key": "team", "value": "vision", "effect": "NoSchedule"}
    api.call(lambda em: em.patch_object("nodes", "node-d", {"spec": {"taints": [taint]}}))
    api.create("pods", other_teams_pod("theirs", "node-a", 3), "vision")
    api.patch_status("pods", "theirs", {"phase": "Running"}, "vision")
    for name in ("node-a", "node-b", "node-c", "node-d", "node-e"):
        await backend.report_node(NodeInfo(name=name, slots=8))


async def test_a_job_is_placed_around_other_pods_and_off_nodes_its_template_excludes(
    kube_api_thread: KubeApi, backend: KubernetesBackend, controller: Running
) -> None:
    api = kube_api_thread
    await cluster(api, backend)
    document = helpers.training_job("llama", template=TEMPLATE)
    api.create("trainingjobs", document)
    record = new_record(parse_job(document), None)

    snapshot = await read_snapshot(ClusterReads.of(backend), Records(record))
    by_name = {n.name: n for n in snapshot.nodes}
    assert by_name["node-a"].in_use_elsewhere == 3 and by_name["node-b"].in_use_elsewhere == 0
    assert snapshot.unfit["llama"] == {
        "node-c": "required node affinity matches no label set of the node",
        "node-d": "taint team=vision:NoSchedule not tolerated",
        "node-e": "nodeSelector pool=train (node has pool=serve)",
    }
    fit = place(record.spec, snapshot.nodes_for("llama"), snapshot.used(), record.avoid_nodes)
    assert fit is not None
    [placement] = fit[0]
    assert placement.node == "node-b", "node-a has 1 GPU left, the others refuse the pod"

    # The pod made for the placement keeps the template's terms, and kube-scheduler's
    # filters (the stand-in's) accept it on that node.
    record.placements = fit[0]
    [group] = worker_groups(record)
    await backend.create_worker_group(group)
    [pod] = await until("the worker group's pod", lambda: pods_of(api, "llama"))
    required = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    [term] = required["nodeSelectorTerms"]
    assert {e["key"] for e in term["matchExpressions"]} == {HEALTHY, COMPUTE}
    assert pod["spec"]["nodeSelector"] == {"pool": "train"}
    pods = api.objects("pods")
    nodes = {n["metadata"]["name"]: n for n in api.objects("nodes")}
    assert feasibility(pod, nodes["node-b"], pods) == []
    for name in ("node-a", "node-c", "node-d", "node-e"):
        assert feasibility(pod, nodes[name], pods), f"the pod is pinned: {name} refuses it"


async def test_a_job_no_node_lets_on_waits_saying_why(
    kube_api_thread: KubeApi, backend: KubernetesBackend
) -> None:
    api = kube_api_thread
    await cluster(api, backend)
    template = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "nodeSelector": {"pool": "batch"}}}
    document = helpers.training_job("llama", template=template)
    record = new_record(parse_job(document), None)
    snapshot = await read_snapshot(ClusterReads.of(backend), Records(record))
    assert place(record.spec, snapshot.nodes_for("llama"), snapshot.used()) is None
    why = why_waiting(record.spec, snapshot.nodes, snapshot.used(), unfit=snapshot.unfit["llama"])
    assert why.startswith("no node of this cluster can hold it: no node lets its pods on")
    assert "node-a: nodeSelector pool=batch (node has pool=train)" in why


def demand_of(api: KubeApi, job: str) -> list[dict[str, Any]]:
    return [p for p in pods_of(api, job) if "resurge.dev/demand" in p["metadata"]["labels"]]


async def test_a_job_that_fits_nowhere_shows_an_autoscaler_its_demand_until_it_runs(
    kube_api_thread: KubeApi, backend: KubernetesBackend, process_kubelet: ProcessKubelet
) -> None:
    """Asked for (annotation ``resurge.dev/demand-pods``), a job waiting for room has
    Pending pods shaped as its worker groups, which cluster-autoscaler and Karpenter
    act on; a node added for them takes them (and counts them as no other team's use);
    they go once the job leaves Pending. Without the annotation, none."""
    api = kube_api_thread
    api.add_node("small", gpus=2, labels=TRAIN)
    process_kubelet.serve("small")
    process_kubelet.serve("added")
    await backend.report_node(NodeInfo(name="small", slots=2))
    template = {"spec": {**TEMPLATE["spec"], "containers": [{"name": "pytorch"}]}}
    document = helpers.training_job("llama", nprocPerNode=4, accelerator=GPU, template=template)
    document["metadata"]["annotations"] = {"resurge.dev/demand-pods": "true"}
    api.create("trainingjobs", document)
    api.create("trainingjobs", helpers.training_job("quiet", nprocPerNode=4, template=template))
    waiting = {
        "phase": "Pending",
        "message": "waiting for capacity: needs 1 node(s) with 4 free slot(s); small has 2",
        "avoidNodes": ["broken"],
    }
    await backend.write_job_status("llama", {**waiting, "name": "llama"})
    await backend.write_job_status("quiet", {**waiting, "name": "quiet"})

    [pod] = await until("llama's demand pod", lambda: demand_of(api, "llama"))
    assert pod["metadata"]["ownerReferences"][0]["name"] == "llama"
    [container] = pod["spec"]["containers"]
    assert container["resources"]["requests"] == {GPU: "4"}
    assert pod["spec"]["nodeSelector"] == {"pool": "train"}
    [term] = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {e["key"] for e in term["matchExpressions"]} == {HEALTHY, COMPUTE}
    assert term["matchFields"] == [
        {"key": "metadata.name", "operator": "NotIn", "values": ["broken"]}
    ]
    name = pod["metadata"]["name"]

    def unschedulable() -> str | None:
        conditions = (api.get("pods", name).get("status") or {}).get("conditions") or []
        return next((c["message"] for c in conditions if c.get("reason") == "Unschedulable"), None)

    message = await until("the demand pod Unschedulable", unschedulable)
    assert message == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    assert not demand_of(api, "quiet"), "no demand pods unless asked for"

    # The autoscaler's answer: a node that fits. The demand pod lands there, and what it
    # holds is not counted as another team's: the job may take the node.
    api.add_node("added", gpus=8, labels=TRAIN)
    await backend.report_node(NodeInfo(name="added", slots=8))
    await until(
        "the demand pod bound to the added node",
        lambda: api.get("pods", name)["spec"].get("nodeName") == "added",
    )
    added = next(n for n in await backend.live_nodes() if n.name == "added")
    assert added.in_use_elsewhere == 0

    await backend.write_job_status(
        "llama", {"name": "llama", "phase": "Running", "message": "running"}
    )
    await until("the demand pods gone", lambda: not demand_of(api, "llama"))


def test_demand_pods_are_asked_for_and_never_for_a_queued_job() -> None:
    asked = helpers.training_job("llama")
    asked["metadata"]["annotations"] = {"resurge.dev/demand-pods": "true"}
    assert wants_demand_pods(asked)
    assert not wants_demand_pods(helpers.training_job("llama"))
    queued = {**asked, "spec": {**asked["spec"], "queue": "team-queue"}}
    assert not wants_demand_pods(queued), "Kueue gates a queued job's pods and shows its demand"


async def test_a_pod_the_scheduler_cannot_place_is_an_event_on_its_training_job(
    kube_api_thread: KubeApi,
    backend: KubernetesBackend,
    controller: Running,
    process_kubelet: ProcessKubelet,
) -> None:
    """What resurge's placement does not weigh (here: cpu, which another team's pod
    holds) leaves the pod Pending; the scheduler's words reach the TrainingJob as a
    PodUnschedulable Warning Event, where `kubectl describe tj` shows them."""
    api = kube_api_thread
    api.add_node("node-a", gpus=4, labels=TRAIN)
    process_kubelet.serve("node-a")
    cpu_hog = other_teams_pod("theirs", "node-a", 0)
    cpu_hog["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "16"}}
    cpu_hog["spec"]["containers"][0]["command"] = ["sleep", "600"]
    api.create("pods", cpu_hog, "vision")
    template = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}]}}
    document = helpers.training_job("llama", template=template)
    api.create("trainingjobs", document)
    record = new_record(parse_job(document), None)
    fit = place(record.spec, [NodeInfo(name="node-a", slots=4)], {})
    assert fit is not None
    record.placements = fit[0]
    [group] = worker_groups(record)
    await backend.create_worker_group(group)

    def unschedulable() -> list[dict[str, Any]]:
        return [
            e
            for e in api.objects("events", "default")
            if e["reason"] == "PodUnschedulable" and e["involvedObject"]["name"] == "llama"
        ]

    [event] = await until("a PodUnschedulable Event on llama", unschedulable)
    assert event["type"] == "Warning"
    assert (
        "placed on node-a) cannot be scheduled: 0/1 nodes are available: 1 Insufficient cpu."
        in (event["message"])
    )
