"""End to end with Kueue: a LocalQueue whose ClusterQueue has quota for one job, and two
jobs in it. The first trains to Succeeded; the second waits, with a Kueue Workload and
no pod, until the first has finished (its Workload Finished releases the quota), then
trains to Succeeded too.

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

from resurge.events import ProcessStarted
from tests.collect import Events
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually_async
from tests.kubernetes.kueue import running_kueue
from tests.kubernetes.test_e2e import PLAIN_SCRIPT, ddp_job, events  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NODES = {"kn-0": 2, "kn-1": 2}


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane of its own (tests/kubernetes/e2e_cluster.py), Kueue's stand-in
    running, a ClusterQueue with 1 cpu of quota and the LocalQueue ``team-queue``."""
    with running_kueue(kube_api_module):
        plane = ControlPlane(kube_api_module, nats_url, tmp_path_factory.mktemp("k8s-kueue"))
        _queues(kube_api_module)
        try:
            plane.start(NODES)
            yield plane
        finally:
            plane.stop()
        assert plane.kubelet is not None
        assert not plane.kubelet.all_pids(), "pod processes outlived the kubelet"
        assert not plane.kubelet.errors, f"the kubelet ran into: {plane.kubelet.errors}"


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
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {
                                "name": "default-flavor",
                                "resources": [{"name": "cpu", "nominalQuota": 1}],
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


def queued(name: str, tmp_path: Path, plain: bool) -> dict[str, Any]:
    """One pod of one rank asking for 1 cpu (the ClusterQueue's whole quota), 60 short
    steps, in the LocalQueue ``team-queue``."""
    body = ddp_job(name, tmp_path / name, 60, nproc=1, replicas={"min": 1, "max": 1})
    body["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = "team-queue"
    body["spec"]["template"] = {
        "spec": {
            "hostNetwork": True,
            "containers": [{"name": "trainer", "resources": {"requests": {"cpu": "1"}}}],
        }
    }
    if plain:
        body["spec"]["command"] = [
            "python", str(PLAIN_SCRIPT), "--steps", "60", "--step-seconds", "0.05",
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
        reasons = [e["reason"] for e in plane.events_of("second")]
        assert "WaitingForKueue" not in reasons or "AdmittedByKueue" in reasons
    finally:
        for job in ("first", "second"):
            with contextlib.suppress(Exception):  # the second may not exist
                plane.api.delete("trainingjobs", job)
        await eventually_async(
            lambda: not (plane.pods("first") or plane.pods("second")), 60, "pods left"
        )
