"""Each service's RBAC grants exactly the Kubernetes API calls its code makes.

What the code uses is read from the code, not from a copy of the roles: the calls of the
official ``kubernetes`` client in ``shared/resurge/cluster/kubernetes/`` are found
with ``ast`` (a method of a ``CoreV1Api`` or ``CustomObjectsApi`` attribute, called or
passed on, e.g. to ``_call``; a list method passed to ``follow`` or ``informer`` lists and
watches), and
each method name becomes (apiGroup, resource, verb) by the client's naming:
``read_node`` is get on nodes, ``list_namespaced_pod`` list on pods,
``patch_namespaced_custom_object_status`` patch on ``trainingjobs/status``.

The calls are attributed to services: each service's folder under ``services/`` is
scanned for the backend methods it calls (``backend.cordon(...)``), and those methods are
followed through the backend and its controller (``self.x``, ``self.backend.x``,
``Controller(...).x``) to the client calls they reach. A backend call under
``if ...launches_worker_groups:`` is left out: the Kubernetes backend never launches
worker groups itself.

Then, from the built manifests (every overlay, as tests/unit/test_deploy.py builds them),
each ServiceAccount's bound rules must be free of wildcards and grant nothing the
service's code never uses, and everything it uses must be granted, but for the few
permissions ``NOT_GRANTED`` names with the reason.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.unit.test_deploy import BUILDS, NAMESPACE, REPO, Doc, build, of_kind

CLUSTER = REPO / "shared" / "resurge" / "cluster"
BACKEND = "KubernetesBackend"
API_CLASSES = ("CoreV1Api", "CoordinationV1Api", "PolicyV1Api", "CustomObjectsApi")
# The API group of each client API class's resources (the custom objects': the CRD's).
API_GROUPS = {"CoreV1Api": "", "CoordinationV1Api": "coordination.k8s.io", "PolicyV1Api": "policy"}
# Each service: its code under services/ and its ServiceAccount.
SERVICES = {
    "detector": ("detector", "resurge-detector"),
    "restarter": ("restarter", "resurge-restarter"),
    "scaler": ("scaler", "resurge-scaler"),
    "node-monitor": ("node-agent", "resurge-node-monitor"),
}

Permission = tuple[str, str, str]
"""(apiGroup, resource, verb); a subresource as ``resource/sub``."""

# Used by the code, deliberately not granted.
NOT_GRANTED: dict[tuple[str, Permission], str] = {
    ("node-monitor", ("", "nodes", "create")): (
        "the monitor registers a Node only where no kubelet did (an emulator); on a real "
        "cluster the kubelet always has"
    ),
}

# The client's method prefixes and the RBAC verb of each (longest first).
VERBS = (
    ("delete_collection_", "deletecollection"),
    ("create_", "create"),
    ("delete_", "delete"),
    ("get_", "get"),
    ("list_", "list"),
    ("patch_", "patch"),
    ("read_", "get"),
    ("replace_", "update"),
)
SUBRESOURCES = ("_status", "_scale", "_log", "_eviction", "_binding", "_ephemeralcontainers")


# Reading the client calls out of the code


@dataclass(frozen=True)
class ClientCall:
    api: str  # one of API_CLASSES
    method: str
    followed: bool  # passed to follow(): listed, then watched
    where: str
    # A custom-object call's (group, plural) where it is not the TrainingJobs'.
    custom: tuple[str, str] | None = None


@dataclass
class Function:
    calls: list[ClientCall]
    reaches: set[tuple[str, str]]  # (class, method) it calls


def _modules() -> dict[Path, ast.Module]:
    paths = sorted((CLUSTER / "kubernetes").glob("*.py"))
    assert paths, f"no modules in {CLUSTER}/kubernetes"
    return {path: ast.parse(path.read_text(), str(path)) for path in paths}


def _classes(modules: dict[Path, ast.Module]) -> dict[str, ast.ClassDef]:
    return {
        node.name: node
        for tree in modules.values()
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {
        node.name: node
        for node in cls.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def _self_attr(node: ast.expr) -> str | None:
    """``x`` of ``self.x``."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def _api_attributes(classes: dict[str, ast.ClassDef]) -> dict[str, str]:
    """Attribute name -> client API class: ``self.core = k8s.CoreV1Api(api)``."""
    found: dict[str, str] = {}
    for cls in classes.values():
        for node in ast.walk(cls):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in API_CLASSES:
                for target in node.targets:
                    if (attr := _self_attr(target)) is not None:
                        found[attr] = name
    return found


def _attribute_types(cls: ast.ClassDef, known: set[str]) -> dict[str, str]:
    """``self.x`` -> the class of the ``__init__`` argument assigned to it, where that
    argument is annotated with one of ``known`` (``backend: KubernetesBackend``), or of
    the object of ``known`` made for it (``self.jobs = TrainingJobs(...)``)."""
    init = _methods(cls).get("__init__")
    if init is None:
        return {}
    annotated = {}
    for arg in init.args.args:
        note = arg.annotation
        name = note.id if isinstance(note, ast.Name) else getattr(note, "value", None)
        if isinstance(name, str) and name in known:
            annotated[arg.arg] = name
    types = {}
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Name) and func.id in known:
                for target in node.targets:
                    if (attr := _self_attr(target)) is not None:
                        types[attr] = func.id
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            for target in node.targets:
                attr = _self_attr(target)
                if attr is not None and node.value.id in annotated:
                    types[attr] = annotated[node.value.id]
    return types


def _string_constants(modules: dict[Path, ast.Module]) -> dict[str, str]:
    return {
        target.id: node.value.value
        for tree in modules.values()
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


# The constants of shared/resurge/cluster/kubernetes/queueing.py naming Kueue's plurals.
KUEUE_PLURALS = {
    "WORKLOADS": "workloads",
    "RESOURCE_FLAVORS": "resourceflavors",
    "PRIORITY_CLASSES": "workloadpriorityclasses",
}


# Functions whose list-function argument is listed, then watched (an informer's is its
# second argument, after the KubeApi).
FOLLOWERS = {"follow": 0, "informer": 1}


def _followed(function: ast.AST) -> set[int]:
    """The ids of the list functions passed to ``follow(...)`` or ``informer(kube, ...)``."""
    return {
        id(node.args[FOLLOWERS[name]])
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and (name := getattr(node.func, "id", getattr(node.func, "attr", None))) in FOLLOWERS
        and len(node.args) > FOLLOWERS[name]
    }


def _enclosing_calls(function: ast.AST) -> dict[int, ast.Call]:
    """For each node given as an argument, the call it is given to."""
    return {
        id(argument): node
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        for argument in [*node.args, *(keyword.value for keyword in node.keywords)]
    }


@dataclass(frozen=True)
class Scan:
    functions: dict[tuple[str, str], Function]
    crd_group: str
    crd_plural: str
    launches_worker_groups: bool


@functools.cache
def scan() -> Scan:
    modules = _modules()
    classes = _classes(modules)
    apis = _api_attributes(classes)
    assert set(apis.values()) == set(API_CLASSES), f"client APIs found: {apis}"
    constants = _string_constants(modules)
    functions: dict[tuple[str, str], Function] = {}
    for class_name, cls in classes.items():
        methods = _methods(cls)
        types = _attribute_types(cls, set(classes))
        for method_name, function in methods.items():
            followed = _followed(function)
            given_to = _enclosing_calls(function)
            calls, reaches = [], set()
            for node in ast.walk(function):
                if not isinstance(node, ast.Attribute):
                    continue
                owner = node.value
                held = _self_attr(owner)  # self.x.<node.attr>
                if (
                    isinstance(owner, ast.Attribute)
                    and owner.attr in apis
                    and (held is not None or _self_attr(owner.value) in types)
                ):
                    api = apis[owner.attr]
                    custom = None
                    if api == "CustomObjectsApi":
                        # Every custom-object call names the TrainingJobs' plural, or one
                        # of Kueue's (KUEUE_PLURALS, with KUEUE_GROUP).
                        call = given_to.get(id(node))
                        names = (
                            {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}
                            if call
                            else set()
                        )
                        kueue = names & set(KUEUE_PLURALS)
                        assert "CRD_PLURAL" in names or (kueue and "KUEUE_GROUP" in names), (
                            f"{class_name}.{method_name}: {node.attr} not on CRD_PLURAL"
                        )
                        if kueue:
                            [plural] = kueue
                            custom = (constants["KUEUE_GROUP"], KUEUE_PLURALS[plural])
                    calls.append(
                        ClientCall(
                            api,
                            node.attr,
                            id(node) in followed,
                            f"{class_name}.{method_name}",
                            custom,
                        )
                    )
                elif (attr := _self_attr(node)) is not None and attr in methods:
                    reaches.add((class_name, attr))
                elif held in types and node.attr in _methods(classes[types[held]]):
                    reaches.add((types[held], node.attr))
                elif (
                    isinstance(owner, ast.Call)
                    and isinstance(owner.func, ast.Name)
                    and owner.func.id in classes
                    and node.attr in _methods(classes[owner.func.id])
                ):
                    reaches.add((owner.func.id, node.attr))
            functions[(class_name, method_name)] = Function(calls, reaches)
    launches = next(
        node.value.value
        for node in classes[BACKEND].body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "launches_worker_groups"
        and isinstance(node.value, ast.Constant)
    )
    return Scan(functions, constants["CRD_GROUP"], constants["CRD_PLURAL"], bool(launches))


def _plural(snake: str) -> str:
    word = snake.replace("_", "")
    if word.endswith("s"):
        return word  # endpoints
    if word.endswith("y"):
        return word[:-1] + "ies"
    return word + "s"


def permissions(call: ClientCall, crd_group: str, crd_plural: str) -> set[Permission]:
    """What ``call`` needs, by the client's naming convention."""
    assert hasattr(getattr(k8s, call.api), call.method), (
        f"{call.where}: {call.api} has no method {call.method}"
    )
    prefix, verb = next((p, v) for p, v in VERBS if call.method.startswith(p))
    rest = call.method.removeprefix(prefix).removeprefix("namespaced_")
    rest = rest.removesuffix("_for_all_namespaces")
    sub = next((s for s in SUBRESOURCES if rest.endswith(s)), "")
    rest = rest.removesuffix(sub) if sub else rest
    if call.api == "CustomObjectsApi":
        assert rest in ("custom_object", "cluster_custom_object"), call
        group, resource = call.custom or (crd_group, crd_plural)
    else:
        group, resource = API_GROUPS[call.api], _plural(rest)
    resource += sub.replace("_", "/", 1)
    verbs = {verb}
    if call.followed:
        assert verb == "list", f"{call.where}: {call.method} given to follow()"
        verbs.add("watch")
    return {(group, resource, v) for v in verbs}


def reached(entries: set[tuple[str, str]]) -> set[Permission]:
    """The permissions the client calls reachable from ``entries`` need."""
    found = scan()
    seen: set[tuple[str, str]] = set()
    todo = [entry for entry in entries if entry in found.functions]
    used: set[Permission] = set()
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        function = found.functions[key]
        for call in function.calls:
            used |= permissions(call, found.crd_group, found.crd_plural)
        todo.extend(function.reaches - seen)
    return used


# Which backend methods each service calls


def _backend_receiver(node: ast.expr) -> bool:
    """``backend`` or ``<anything>.backend``."""
    return (isinstance(node, ast.Name) and node.id == "backend") or (
        isinstance(node, ast.Attribute) and node.attr == "backend"
    )


def _launches_guard(test: ast.expr) -> bool:
    return any(
        isinstance(node, ast.Attribute) and node.attr == "launches_worker_groups"
        for node in ast.walk(test)
    )


def _backend_uses(tree: ast.AST, methods: set[str], launches: bool) -> Iterator[str]:
    """Backend methods referenced in ``tree``, except under a launches_worker_groups
    guard when the backend does not launch worker groups."""
    if isinstance(tree, ast.If) and not launches and _launches_guard(tree.test):
        for statement in tree.orelse:
            yield from _backend_uses(statement, methods, launches)
        return
    if isinstance(tree, ast.Attribute) and tree.attr in methods and _backend_receiver(tree.value):
        yield tree.attr
    for child in ast.iter_child_nodes(tree):
        yield from _backend_uses(child, methods, launches)


@functools.cache
def backend_methods_of(service: str) -> frozenset[str]:
    folder = REPO / "services" / SERVICES[service][0]
    methods = {m for cls, m in scan().functions if cls == BACKEND and not m.startswith("_")}
    paths = sorted(folder.rglob("*.py"))
    assert paths, folder
    return frozenset(
        use
        for path in paths
        for use in _backend_uses(
            ast.parse(path.read_text(), str(path)), methods, scan().launches_worker_groups
        )
    )


def used_by(service: str) -> set[Permission]:
    return reached({(BACKEND, method) for method in backend_methods_of(service)})


# What the built manifests grant


def _rule_permissions(where: str, rule: Doc) -> tuple[set[Permission], list[str]]:
    problems = [
        f"{where}: a wildcard in {field}: {rule}"
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs")
        if "*" in "".join(rule.get(field) or [])
    ]
    if rule.get("nonResourceURLs"):
        problems.append(f"{where}: grants non-resource URLs: {rule}")
    return {
        (group, resource, verb)
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for verb in rule.get("verbs") or []
    }, problems


def granted(docs: list[Doc], account: str) -> tuple[set[Permission], list[str]]:
    """Every permission the ServiceAccount ``account`` is bound to, and what is wrong
    with its rules (wildcards, aggregation)."""
    roles = {
        (doc["kind"], doc["metadata"]["name"]): doc
        for doc in of_kind(docs, "ClusterRole") + of_kind(docs, "Role")
    }
    grants: set[Permission] = set()
    problems: list[str] = []
    for binding in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding"):
        if not any(
            subject.get("kind") == "ServiceAccount"
            and subject.get("name") == account
            and subject.get("namespace", binding["metadata"].get("namespace")) == NAMESPACE
            for subject in binding.get("subjects") or []
        ):
            continue
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], ref["name"]))
        where = f"{account} via {binding['kind']}/{binding['metadata']['name']}"
        if role is None:
            problems.append(f"{where}: no {ref['kind']}/{ref['name']} in the build")
            continue
        if role.get("aggregationRule"):
            problems.append(f"{where}: {ref['name']} aggregates other roles")
        for rule in role.get("rules") or []:
            permissions_, wrong = _rule_permissions(f"{where} ({ref['name']})", rule)
            grants |= permissions_
            problems += wrong
    return grants, problems


def _show(permission: Permission) -> str:
    group, resource, verb = permission
    return f"{verb} on {resource}" + (f" ({group})" if group else "")


def excess(service: str, grants: set[Permission], used: set[Permission]) -> list[str]:
    return [
        f"{service}: grants {_show(p)}, which its code never uses" for p in sorted(grants - used)
    ]


def missing(service: str, grants: set[Permission], used: set[Permission]) -> list[str]:
    return [
        f"{service}: its code uses {_show(p)}, which its role does not grant"
        for p in sorted(used - grants)
        if (service, p) not in NOT_GRANTED
    ]


# The scan finds what it must


def test_the_scan_finds_the_client_calls_the_backend_makes() -> None:
    everything = reached(set(scan().functions))
    for needed in [
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
        ("", "nodes", "create"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "pods", "watch"),
        ("", "services", "create"),
        ("", "events", "create"),
        ("resurge.dev", "trainingjobs", "get"),
        ("resurge.dev", "trainingjobs", "watch"),
        ("resurge.dev", "trainingjobs/status", "patch"),
    ]:
        assert needed in everything, f"the scan misses {_show(needed)}"


def test_the_scan_misses_no_reference_to_a_client_method() -> None:
    """Every ``.<client method>`` in the modules is one the scan read (none reached
    through an alias or from a function outside the classes)."""
    client_methods = {
        name
        for api in API_CLASSES
        for name in dir(getattr(k8s, api))
        if name.startswith((*(prefix for prefix, _ in VERBS), "connect_"))
    }
    referenced = sorted(
        node.attr
        for tree in _modules().values()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in client_methods
    )
    read = sorted(call.method for f in scan().functions.values() for call in f.calls)
    assert referenced == read


def test_the_scan_attributes_calls_to_the_services_that_make_them() -> None:
    assert not scan().launches_worker_groups
    assert backend_methods_of("detector") == frozenset()
    assert {"cordon", "live_nodes"} <= backend_methods_of("restarter")
    assert {"reconcile", "write_job_status", "live_nodes"} <= backend_methods_of("scaler")
    # The monitor's watch is under `if backend.launches_worker_groups`: not on Kubernetes.
    assert backend_methods_of("node-monitor") == frozenset({"report_node"})
    assert ("", "nodes", "patch") in used_by("restarter")
    assert ("", "pods", "create") in used_by("scaler")
    assert ("", "nodes", "watch") in used_by("scaler")
    assert ("", "nodes", "patch") in used_by("node-monitor")
    # The restarter reads pods (what other pods take of a node) and never makes one.
    restarter_pods = {verb for _, resource, verb in used_by("restarter") if resource == "pods"}
    assert restarter_pods == {"list", "watch"}


@pytest.mark.parametrize(
    ("api", "method", "followed", "expected"),
    [
        ("CoreV1Api", "read_node", False, {("", "nodes", "get")}),
        ("CoreV1Api", "list_node", True, {("", "nodes", "list"), ("", "nodes", "watch")}),
        ("CoreV1Api", "list_namespaced_pod", False, {("", "pods", "list")}),
        ("CoreV1Api", "replace_namespaced_config_map", False, {("", "configmaps", "update")}),
        ("CoreV1Api", "patch_namespaced_pod_status", False, {("", "pods/status", "patch")}),
        ("CoreV1Api", "list_pod_for_all_namespaces", False, {("", "pods", "list")}),
        (
            "CoreV1Api",
            "delete_collection_namespaced_pod",
            False,
            {("", "pods", "deletecollection")},
        ),
        ("CoreV1Api", "read_namespaced_endpoints", False, {("", "endpoints", "get")}),
        (
            "CoordinationV1Api",
            "replace_namespaced_lease",
            False,
            {("coordination.k8s.io", "leases", "update")},
        ),
        (
            "CoordinationV1Api",
            "list_namespaced_lease",
            True,
            {("coordination.k8s.io", "leases", "list"), ("coordination.k8s.io", "leases", "watch")},
        ),
        (
            "CustomObjectsApi",
            "patch_namespaced_custom_object_status",
            False,
            {("resurge.dev", "trainingjobs/status", "patch")},
        ),
        (
            "CustomObjectsApi",
            "get_namespaced_custom_object",
            False,
            {("resurge.dev", "trainingjobs", "get")},
        ),
    ],
)
def test_client_method_names_map_to_rbac(
    api: str, method: str, followed: bool, expected: set[Permission]
) -> None:
    assert permissions(
        ClientCall(api, method, followed, "test"), "resurge.dev", "trainingjobs"
    ) == (expected)


# The roles


@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize("name", BUILDS)
def test_each_service_is_granted_exactly_what_its_code_uses(
    name: str, service: str, scratch: Path
) -> None:
    docs = build(name, scratch)
    account = SERVICES[service][1]
    assert [doc for doc in of_kind(docs, "ServiceAccount") if doc["metadata"]["name"] == account]
    grants, problems = granted(docs, account)
    used = used_by(service)
    print(f"{service}: uses {sorted(used)}; granted {sorted(grants)}")
    problems += excess(service, grants, used) + missing(service, grants, used)
    assert problems == [], "\n".join(problems)


def test_every_permission_left_ungranted_is_one_the_code_uses() -> None:
    for service, permission in NOT_GRANTED:
        assert permission in used_by(service), f"{service}: {_show(permission)} is not used"


def test_an_unused_verb_or_a_wildcard_fails_naming_the_service(scratch: Path) -> None:
    docs = build("base", scratch)
    role = next(
        doc
        for doc in of_kind(docs, "ClusterRole")
        if doc["metadata"]["name"] == "resurge-restarter"
    )
    extra = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}
    changed = [doc for doc in docs if doc is not role] + [
        {**role, "rules": [*role["rules"], extra]}
    ]
    grants, problems = granted(changed, "resurge-restarter")
    assert problems == []
    assert excess("restarter", grants, used_by("restarter")) == [
        "restarter: grants create on pods, which its code never uses"
    ]
    for field in ("apiGroups", "resources", "verbs"):
        wild = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"], field: ["*"]}
        changed = [doc for doc in docs if doc is not role] + [{**role, "rules": [wild]}]
        _, problems = granted(changed, "resurge-restarter")
        assert len(problems) == 1 and "resurge-restarter" in problems[0], (field, problems)
        assert f"wildcard in {field}" in problems[0]


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kustomize-rbac")
