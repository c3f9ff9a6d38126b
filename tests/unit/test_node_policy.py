"""deploy/overlays/node-policy: the ValidatingAdmissionPolicy that lets each node monitor
change only the Node it runs on (RBAC cannot: ``resourceNames`` would have to name every
node, and a DaemonSet's one pod template cannot name each pod's own). It builds onto an
overlay, is valid Kubernetes 1.30 and later in strict mode, and its CEL, evaluated with
celpy as the API server evaluates a policy ("Validating Admission Policy",
https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/:
``request``, ``object``, ``matchConditions`` then ``validations``), admits a monitor's
patch of its own Node and refuses one of another Node, or from a token that names no
node (a pod-bound service account token carries the node's name in the user's extra
``authentication.kubernetes.io/node-name``, as Kubernetes' own per-node policy example,
test/e2e/auth/e2edata/per_node_validatingadmissionpolicy.yaml, reads it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from celpy.adapter import json_to_cel

from tests.unit.test_deploy import build, named, of_kind

BUILD = "production+node-policy"
MONITOR = "system:serviceaccount:resurge-system:resurge-node-monitor"
NODE_NAME = "authentication.kubernetes.io/node-name"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kustomize")


def policy(scratch: Path) -> dict[str, Any]:
    return named(
        build(BUILD, scratch), "ValidatingAdmissionPolicy", "resurge-node-monitor-own-node"
    )


@pytest.mark.parametrize("kubernetes", ["1.30", kubernetes_validate.latest_version()])
def test_the_component_builds_and_is_valid(kubernetes: str, scratch: Path) -> None:
    docs = build(BUILD, scratch)
    for doc in of_kind(docs, "ValidatingAdmissionPolicy") + of_kind(
        docs, "ValidatingAdmissionPolicyBinding"
    ):
        kubernetes_validate.validate(doc, kubernetes, strict=True)
    binding = named(docs, "ValidatingAdmissionPolicyBinding", "resurge-node-monitor-own-node")
    assert binding["spec"] == {
        "policyName": "resurge-node-monitor-own-node",
        "validationActions": ["Deny"],
    }
    # The user it matches is the node monitor's ServiceAccount in the build.
    account = named(docs, "ServiceAccount", "resurge-node-monitor")
    assert (
        f"system:serviceaccount:{account['metadata']['namespace']}:resurge-node-monitor"
    ) == MONITOR


def admitted(spec: dict[str, Any], user: str, extra: dict[str, list[str]], node: str) -> bool:
    """Whether the policy admits ``user`` (with ``extra``) updating Node ``node``."""
    env = celpy.Environment()
    activation = {
        "request": json_to_cel(
            {"name": node, "operation": "UPDATE", "userInfo": {"username": user, "extra": extra}}
        ),
        "object": json_to_cel({"metadata": {"name": node}}),
    }

    def holds(expression: str) -> bool:
        result = env.program(env.compile(expression)).evaluate(activation)
        return bool(result)

    if not all(holds(c["expression"]) for c in spec["matchConditions"]):
        return True  # not the monitor: the policy does not apply
    return all(holds(v["expression"]) for v in spec["validations"])


def test_a_monitor_may_change_its_own_node_only(scratch: Path) -> None:
    spec = policy(scratch)["spec"]
    own = {NODE_NAME: ["gpu-1"]}
    assert spec["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes", "nodes/status"]
    assert admitted(spec, MONITOR, own, "gpu-1")
    assert not admitted(spec, MONITOR, own, "gpu-2"), "another node"
    assert not admitted(spec, MONITOR, {}, "gpu-1"), "a token that names no node"
    assert admitted(spec, "system:serviceaccount:resurge-system:resurge-restarter", {}, "gpu-2")
