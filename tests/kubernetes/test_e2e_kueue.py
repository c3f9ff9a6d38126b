"""End to end with Kueue: a LocalQueue whose ClusterQueue has 2 cpus of quota.

- Two jobs of one pod asking for 2 cpus each: the first trains to Succeeded; the second
  waits, with a Kueue Workload and no pod, until the first has finished (its Workload
  Finished releases the quota), then trains to Succeeded too.
- A low-priority elastic job of 1 to 2 pods of 1 cpu runs at 2; a high-priority job of
  one such pod comes: Kueue preempts the elastic part of the first (its own Workload),
  which shrinks to 1 replica after a checkpoint, the second trains to Succeeded, and
  the first grows back to 2 replicas.
- A low-priority fixed-size job holding the whole quota is preempted by a high-priority
  one: it checkpoints and is suspended, and resumes from its checkpoint afterwards.

Real parts and stand-ins as in tests/kubernetes/test_e2e.py (real nats-server, services,
monitors, node agents and torch workers; the API emulator and the process kubelet), with
Kueue's CRDs and the admission stand-in of tests/kubernetes/kueue.py in place of Kueue.
The first job runs a torchrun-style script that never imports resurge
(tests/e2e/workers/plain_ddp.py), the second examples/ddp/train.py, which does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resurge.events import Assign, ProcessStarted, Progress, ScaleDecided
from tests.collect import Events
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually_async
from tests.kubernetes.kueue import running_kueue
from tests.kubernetes.test_e2e import (  # noqa: F401
    EVERY,
    PLAIN_SCRIPT,
    ddp_job,
    events,
    steps_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NODES = {"kn-0": 2, "kn-1": 2}


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane of its own (tests/kubernetes/e2e_cluster.py), Kueue's stand-in
    running, a ClusterQueue with 2 cpus of quota (lower priorities preempted within it),
    the LocalQueue ``team-queue`` and the WorkloadPriorityClasses ``low`` and ``high``."""
    with running_kueue(kube_api_module):
        plane = ControlPlane(kube_api_module, nats_url, tmp_path_factory.mktemp("k8s-kueue"))
        _queues(kube_api_module)
        with plane.running(NODES):
            yield plane


def _queues(api: KubeApi) -> None:
    api.create(
        "resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "ResourceFlavor",
            "metadata": {"name": "default-flavor"},
            "spec": {},
        },
    )
    api.create(
        "clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "ClusterQueue",
            "metadata": {"name": "cluster"},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {
                                "name": "default-flavor",
                                "resources": [{"name": "cpu", "nominalQuota": 2}],
                            }
                        ],
                    }
                ],
            },
        },
    )
    api.create(
        "localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "LocalQueue",
            "metadata": {"name": "team-queue", "namespace": "default"},
            "spec": {"clusterQueue": "cluster"},
        },
    )
    for name, value in (("low", 10), ("high", 1000)):
        api.create(
            "workloadpriorityclasses",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )


def queued(
    name: str,
    tmp_path: Path,
    plain: bool,
    cpus: int = 2,
    steps: int = 60,
    replicas: dict[str, int] | None = None,
    priority: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """Pods of one rank asking for ``cpus`` each (2: the ClusterQueue's whole quota),
    ``steps`` short steps, in the LocalQueue ``team-queue`` at WorkloadPriorityClass
    ``priority``; one replica unless ``replicas`` says."""
    replicas = replicas or {"min": 1, "max": 1}
    body = ddp_job(name, tmp_path / name, steps, nproc=1, replicas=replicas, **spec)
    labels = body["metadata"].setdefault("labels", {})
    labels["kueue.x-k8s.io/queue-name"] = "team-queue"
    if priority is not None:
        labels["kueue.x-k8s.io/priority-class"] = priority
    body["spec"]["template"] = {
        "spec": {
            "hostNetwork": True,
            "containers": [{"name": "trainer", "resources": {"requests": {"cpu": str(cpus)}}}],
        }
    }
    if plain:
        body["spec"]["command"] = [
            "python", str(PLAIN_SCRIPT), "--steps", str(steps), "--step-seconds", "0.05",
        ]  # fmt: skip
    return body


def phase(plane: ControlPlane, job: str) -> str | None:
    return (plane.training_job(job).get("status") or {}).get("phase")


def workload_of(plane: ControlPlane, job: str) -> dict[str, Any] | None:
    return next(
        (
            w
            for w in plane.api.objects("workloads", "default")
            if w["metadata"]["ownerReferences"][0]["name"] == job
        ),
        None,
    )


async def test_the_second_job_waits_without_pods_until_the_first_finishes(
    plane: ControlPlane,
    events: Events,  # noqa: F811
    tmp_path: Path,
) -> None:
    plane.api.create("trainingjobs", queued("first", tmp_path, plain=True))
    try:
        await events.wait_for(
            lambda items: any(isinstance(e, ProcessStarted) and e.job == "first" for e in items),
            120,
        )
        plane.api.create("trainingjobs", queued("second", tmp_path, plain=False))
        waiting = await eventually_async(
            lambda: workload_of(plane, "second"), 30, "second's Workload"
        )
        assert "admission" not in (waiting.get("status") or {})
        # Checked all the while the first runs (an absence: there is no event to await).
        while phase(plane, "first") not in ("Succeeded", "Failed"):
            assert plane.pods("second") == [], "a pod before Kueue admitted the job"
            await asyncio.sleep(0.2)
        assert phase(plane, "first") == "Succeeded"
        await eventually_async(lambda: plane.pods("second"), 60, "second's pod")
        final = await eventually_async(
            lambda: (
                phase(plane, "second")
                if phase(plane, "second") in ("Succeeded", "Failed")
                else None
            ),
            120,
            lambda: f"second finished; status {plane.training_job('second').get('status')}",
        )
        assert final == "Succeeded"
        first = workload_of(plane, "first")
        assert first is not None
        assert any(c["type"] == "Finished" for c in first["status"]["conditions"])
        reasons = [
            e["reason"]
            for e in plane.events_of("second")
            if e["reason"] in ("WaitingForKueue", "AdmittedByKueue")
        ]
        # Events list by name, not in order: one wait, one admission.
        assert sorted(reasons) == ["AdmittedByKueue", "WaitingForKueue"], reasons
    finally:
        for job in ("first", "second"):
            with contextlib.suppress(Exception):  # the second may not exist
                plane.api.delete("trainingjobs", job)
        await eventually_async(
            lambda: not (plane.pods("first") or plane.pods("second")), 60, "pods left"
        )


def scale(items: list[Any], job: str, resize: str) -> list[ScaleDecided]:
    return [e for e in items if isinstance(e, ScaleDecided) and e.job == job and e.resize == resize]


def world(items: list[Any], job: str, size: int) -> Assign | None:
    """The last Assign of ``job`` to a world of ``size`` ranks."""
    found = [e for e in items if isinstance(e, Assign) and e.job == job and e.world_size == size]
    return found[-1] if found else None


async def test_kueue_preempts_the_elastic_part_of_a_low_priority_job_which_grows_back(
    plane: ControlPlane,
    events: Events,  # noqa: F811
    tmp_path: Path,
) -> None:
    low = queued(
        "low", tmp_path, plain=False, cpus=1, steps=4000, replicas={"min": 1, "max": 2},
        priority="low", elastic={"cooldownSeconds": 1, "scaleUpSnoozeSeconds": 0},
    )  # fmt: skip
    plane.api.create("trainingjobs", low)
    try:
        await events.wait_for(lambda items: world(items, "low", 2), 120)
        await events.wait_for(lambda items: steps_of(items, "low") > 0, 120)
        high = queued("high", tmp_path, plain=True, cpus=1, priority="high")
        plane.api.create("trainingjobs", high)
        [shrink] = await events.wait_for(lambda items: scale(items, "low", "shrink"), 120)
        assert (shrink.from_replicas, shrink.to_replicas) == (2, 1), shrink
        await events.wait_for(
            lambda items: any(
                isinstance(e, Assign) and e.job == "low" and e.generation >= shrink.to_generation
                and e.world_size == 1
                for e in items
            ),
            120,
        )  # fmt: skip
        final = await eventually_async(
            lambda: (
                phase(plane, "high") if phase(plane, "high") in ("Succeeded", "Failed") else None
            ),
            120,
            lambda: f"high finished; status {plane.training_job('high').get('status')}",
        )
        assert final == "Succeeded"
        [grow] = await events.wait_for(
            lambda items: [
                e for e in scale(items, "low", "grow") if e.from_generation >= shrink.to_generation
            ][:1],
            120,
        )
        assert (grow.from_replicas, grow.to_replicas) == (1, 2), grow
        await events.wait_for(
            lambda items: (
                (a := world(items, "low", 2)) is not None and a.generation >= grow.to_generation
            ),
            120,
        )
        base = [
            w for w in plane.api.objects("workloads", "default")
            if w["metadata"]["ownerReferences"][0]["name"] == "low"
        ]  # fmt: skip
        assert len(base) == 2, "low is a base and an elastic Workload"
    finally:
        for job in ("low", "high"):
            with contextlib.suppress(Exception):
                plane.api.delete("trainingjobs", job)
        await eventually_async(
            lambda: not (plane.pods("low") or plane.pods("high")), 60, "pods left"
        )


async def test_kueue_preempts_a_fixed_size_job_which_is_suspended_and_resumed(
    plane: ControlPlane,
    events: Events,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A low-priority fixed-size job holding the whole quota is preempted by a
    high-priority one: it checkpoints and is suspended (its pod deleted, the
    TrainingJob's Suspended condition), the high-priority job trains to Succeeded, and
    the first is resumed from its checkpoint once Kueue admits it again."""
    fixed = queued("fixed", tmp_path, plain=False, steps=4000, priority="low")
    plane.api.create("trainingjobs", fixed)
    try:
        await events.wait_for(lambda items: steps_of(items, "fixed") > 2 * EVERY, 120)
        plane.api.create("trainingjobs", queued("urgent", tmp_path, plain=True, priority="high"))
        [suspend] = await events.wait_for(lambda items: scale(items, "fixed", "suspend"), 120)
        assert (suspend.from_replicas, suspend.to_replicas) == (1, 0), suspend
        suspended = await eventually_async(
            lambda: [
                c
                for c in (plane.training_job("fixed").get("status") or {}).get("conditions") or []
                if c["type"] == "Suspended" and c["status"] == "True"
            ],
            60,
            lambda: f"fixed Suspended; status {plane.training_job('fixed').get('status')}",
        )
        assert suspended
        await eventually_async(lambda: not plane.pods("fixed"), 60, "fixed's pod deleted")
        final = await eventually_async(
            lambda: (
                phase(plane, "urgent")
                if phase(plane, "urgent") in ("Succeeded", "Failed")
                else None
            ),
            120,
            lambda: f"urgent finished; status {plane.training_job('urgent').get('status')}",
        )
        assert final == "Succeeded"
        resumed = await events.wait_for(
            lambda items: [
                e
                for e in items
                if isinstance(e, Progress)
                and e.job == "fixed"
                and e.generation >= suspend.to_generation
            ][:1],
            120,
        )
        assert resumed[0].step > EVERY, f"resumed from its checkpoint, not step 0: {resumed}"
    finally:
        for job in ("fixed", "urgent"):
            with contextlib.suppress(Exception):
                plane.api.delete("trainingjobs", job)
        await eventually_async(
            lambda: not (plane.pods("fixed") or plane.pods("urgent")), 60, "pods left"
        )
