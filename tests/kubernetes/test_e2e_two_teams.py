"""End to end: two teams share one cluster through one Kueue queue, and neither team's
code can act on the other's job.

Team A's TrainingJob ``low`` (namespace ``team-a``, bus name ``team-a/low``) is a
low-priority elastic job of 1 to 2 pods of 1 cpu; team B's ``high`` (``team-b/high``)
a high-priority job of one such pod. Both namespaces' LocalQueues feed one ClusterQueue
with 2 cpus of quota that preempts lower priorities. ``low`` runs at 2 replicas; ``high``
comes; Kueue preempts ``low``'s elastic part, which shrinks 2 -> 1 after a checkpoint;
``high`` trains to Succeeded; ``low`` grows back 1 -> 2.

While both run, a root worker of ``low`` holding its pod's own NATS user (the Secret
``<pod>-nats`` in ``team-a``; NATS runs in operator mode, each pod a user of its own)
publishes an exit of ``high``'s rank 0 and a node-level XID 79 of its own node: the
server refuses both, neither reaches the bus, and ``high`` is never recovered. Each
pod's Secret is in its own job's namespace.

Real parts and stand-ins as in tests/kubernetes/test_e2e.py (real nats-server, services,
monitors, node agents and torch workers; the API emulator and the process kubelet), with
Kueue's CRDs and the admission stand-in of tests/kubernetes/kueue.py in place of Kueue.
``high`` runs a torchrun-style script that never imports resurge
(tests/e2e/workers/plain_ddp.py), ``low`` examples/ddp/train.py, which does (an elastic
job needs its progress reported).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resurge.cluster.kubernetes.pod_credentials import issued_of, secret_name
from resurge.events import (
    Assign,
    GpuError,
    ProcessExited,
    ProcessStarted,
    RecoveryStarted,
)
from tests.collect import Events
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually_async, operator_nats
from tests.kubernetes.kueue import running_kueue
from tests.kubernetes.test_e2e import events, steps_of  # noqa: F401
from tests.kubernetes.test_e2e_kueue import _queues, queued, scale, world
from tests.kubernetes.test_e2e_pod_users import FORGED_PID, forge

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

NODES = {"kt-0": 2, "kt-1": 2}
TEAM_A, TEAM_B = "team-a", "team-b"
LOW, HIGH = f"{TEAM_A}/low", f"{TEAM_B}/high"  # their bus names


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane on operator-mode NATS (each pod its own user), Kueue's stand-in
    running, the ClusterQueue ``cluster`` (2 cpus, lower priorities preempted within it),
    the LocalQueue ``team-queue`` in each team's namespace and the
    WorkloadPriorityClasses ``low`` and ``high`` (tests/kubernetes/test_e2e_kueue.py)."""
    root = tmp_path_factory.mktemp("k8s-teams")
    with operator_nats(root / "nats") as (url, identities), running_kueue(kube_api_module):
        plane = ControlPlane(kube_api_module, url, root, identities=identities)
        _queues(kube_api_module)
        for team in (TEAM_A, TEAM_B):
            kube_api_module.create(
                "localqueues",
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta1",
                    "kind": "LocalQueue",
                    "metadata": {"name": "team-queue", "namespace": team},
                    "spec": {"clusterQueue": "cluster"},
                },
                team,
            )
        with plane.running(NODES):
            yield plane


def pods_in(plane: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    """TrainingJob ``name``'s pods in ``namespace`` now."""
    return [
        p
        for p in plane.api.objects("pods", namespace)
        if (p["metadata"].get("labels") or {}).get("resurge.dev/job") == name
    ]


def phase_in(plane: ControlPlane, namespace: str, name: str) -> str | None:
    return (plane.api.get("trainingjobs", name, namespace).get("status") or {}).get("phase")


def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]


def one(pods: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``pods`` when there is exactly one, else None (to wait on)."""
    return pods if len(pods) == 1 else None


def secrets_named(plane: ControlPlane, name: str) -> list[str]:
    """The namespaces holding a Secret called ``name``."""
    return [
        ns
        for ns in ("default", TEAM_A, TEAM_B)
        if any(s["metadata"]["name"] == name for s in plane.api.objects("secrets", ns))
    ]


async def test_two_teams_share_a_kueue_queue_preempt_elastically_and_cannot_forge(
    plane: ControlPlane,
    events: Events,  # noqa: F811
    tmp_path: Path,
) -> None:
    low = queued(
        "low", tmp_path, plain=False, cpus=1, steps=4000, replicas={"min": 1, "max": 2},
        priority="low", elastic={"cooldownSeconds": 1, "scaleUpSnoozeSeconds": 0},
    )  # fmt: skip
    low["metadata"]["namespace"] = TEAM_A
    plane.api.create("trainingjobs", low, TEAM_A)
    try:
        await events.wait_for(lambda items: world(items, LOW, 2), 120)
        await events.wait_for(lambda items: steps_of(items, LOW) > 0, 120)

        # ~15 s of steps: long enough to forge while it runs.
        high = queued("high", tmp_path, plain=True, cpus=1, steps=300, priority="high")
        high["metadata"]["namespace"] = TEAM_B
        plane.api.create("trainingjobs", high, TEAM_B)
        [shrink] = await events.wait_for(lambda items: scale(items, LOW, "shrink"), 120)
        assert (shrink.from_replicas, shrink.to_replicas) == (2, 1), shrink
        await events.wait_for(
            lambda items: any(
                isinstance(e, Assign) and e.job == LOW and e.generation >= shrink.to_generation
                and e.world_size == 1
                for e in items
            ),
            120,
        )  # fmt: skip
        await events.wait_for(
            lambda items: any(isinstance(e, ProcessStarted) and e.job == HIGH for e in items),
            120,
        )

        # Both run: each pod's user is in a Secret of its own job's namespace only. The
        # shrink's Assign goes out before the removed replica's pod is deleted: wait for one.
        [pod_a] = await eventually_async(
            lambda: one(running(pods_in(plane, TEAM_A, "low"))), 60, "low's one running pod"
        )
        [pod_b] = await eventually_async(
            lambda: one(running(pods_in(plane, TEAM_B, "high"))), 60, "high's running pod"
        )
        for pod, team in ((pod_a, TEAM_A), (pod_b, TEAM_B)):
            assert secrets_named(plane, secret_name(pod["metadata"]["name"])) == [team]
        user_a = issued_of(plane.api.get("secrets", secret_name(pod_a["metadata"]["name"]), TEAM_A))
        assert user_a is not None

        # Team A's root worker, with its pod's user, speaks for team B's job and the node.
        refusals = await forge(
            plane,
            user_a.creds,
            LOW,
            HIGH,
            node=pod_a["spec"]["nodeName"],
            other_pod=(TEAM_B, pod_b["metadata"]["name"]),
        )
        assert len(refusals) == 2, refusals
        assert phase_in(plane, TEAM_B, "high") not in ("Succeeded", "Failed"), (
            "high finished before the forgeries: they were not tried while both ran"
        )

        final = await eventually_async(
            lambda: (
                p if (p := phase_in(plane, TEAM_B, "high")) in ("Succeeded", "Failed") else None
            ),
            120,
            lambda: f"high finished; status {plane.api.get('trainingjobs', 'high', TEAM_B)}",
        )
        assert final == "Succeeded"
        high_status = plane.api.get("trainingjobs", "high", TEAM_B)["status"]
        assert not high_status.get("restarts"), high_status
        [grow] = await events.wait_for(
            lambda items: [
                e for e in scale(items, LOW, "grow") if e.from_generation >= shrink.to_generation
            ][:1],
            120,
        )
        assert (grow.from_replicas, grow.to_replicas) == (1, 2), grow
        await events.wait_for(
            lambda items: (
                (a := world(items, LOW, 2)) is not None and a.generation >= grow.to_generation
            ),
            120,
        )
        # Nothing forged reached the control plane; team B's job was never recovered.
        assert not [e for e in events.items if isinstance(e, RecoveryStarted) and e.job == HIGH]
        assert not [e for e in events.items if isinstance(e, ProcessExited) and e.pid == FORGED_PID]
        assert not [e for e in events.items if isinstance(e, GpuError) and e.message == "forged"]
        workloads = {
            (w["metadata"]["namespace"], w["metadata"]["ownerReferences"][0]["name"])
            for team in (TEAM_A, TEAM_B)
            for w in plane.api.objects("workloads", team)
        }
        assert workloads == {(TEAM_A, "low"), (TEAM_B, "high")}, workloads
    finally:
        for team, name in ((TEAM_A, "low"), (TEAM_B, "high")):
            with contextlib.suppress(Exception):  # high may not exist
                plane.api.delete("trainingjobs", name, team)
        await eventually_async(
            lambda: not (pods_in(plane, TEAM_A, "low") or pods_in(plane, TEAM_B, "high")),
            60,
            "pods left",
        )
