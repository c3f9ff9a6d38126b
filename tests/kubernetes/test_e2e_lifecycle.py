"""End to end on the Kubernetes backend: a TrainingJob's life as a real API server
would have it. A finished job never runs again (``kubectl label`` is a metadata-only
patch), and a TrainingJob deleted while the controller (the scaler) is SIGKILLed leaves
nothing behind once it is back: no pod, no Service, no record.

Real parts and stand-ins as in test_e2e.py (whose helpers this reuses): nats-server, the
services and node monitors as processes, the official client over HTTP, torch workers in
each pod; the API emulator and the process kubelet stand in for the cluster. The module
has its own control plane (one node of 2 GPUs): a test here kills its scaler.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from resurge.events import JobSubmitted, ProcessStarted
from tests.collect import Events
from tests.kubernetes import test_e2e as e2e
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.e2e_cluster import ControlPlane, eventually_async
from tests.kubernetes.test_e2e import (
    create,
    ddp_job,
    status,
    status_if,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

NODES = {"kl-0": 2}
FINALIZER = "resurge.dev/cleanup"
ONE = {"min": 1, "max": 1}


@pytest.fixture(scope="module")
def plane(
    kube_api_module: KubeApi, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """The module's control plane, ready; stopped after, with no pod process left."""
    plane = ControlPlane(kube_api_module, nats_url, tmp_path_factory.mktemp("k8s-life"))
    with plane.running(NODES):
        yield plane


# test_e2e.py's fixtures, on this module's control plane (``plane`` above).
events = e2e.events
jobs = e2e.jobs


def exists(plane: ControlPlane, name: str) -> dict[str, Any] | None:
    return next(
        (tj for tj in plane.api.objects("trainingjobs") if tj["metadata"]["name"] == name), None
    )


def labelled(plane: ControlPlane, kind: str, job: str) -> list[str]:
    """Names of the ``kind`` objects labelled as ``job``'s."""
    return [
        o["metadata"]["name"]
        for o in plane.api.objects(kind, "default")
        if (o["metadata"].get("labels") or {}).get("resurge.dev/job") == job
    ]


def runs_of(plane: ControlPlane, job: str) -> set[str]:
    """The uids of every pod of ``job`` the kubelet has run."""
    assert plane.kubelet is not None
    return {
        uid
        for uid, run in plane.kubelet.runs.items()
        if run.pod["metadata"]["labels"].get("resurge.dev/job") == job
    }


async def label(plane: ControlPlane, name: str, labels: dict[str, str]) -> None:
    """``kubectl label trainingjob NAME k=v``: a merge patch of metadata only, through
    the official client."""
    api = k8s.CustomObjectsApi(plane.api.api_client())
    await asyncio.to_thread(
        api.patch_namespaced_custom_object,
        "resurge.dev", "v1alpha1", "default", "trainingjobs", name,
        {"metadata": {"labels": labels}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip


async def acted_on(plane: ControlPlane, jobs: list[str], marker: str) -> None:
    """Every TrainingJob change made before now acted on by the controller, which takes
    them in order from one watch: a TrainingJob it must reject (created now) is marked
    Failed only after them."""
    body = {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": marker},
        # Refused by resurge, not by the CRD (which cannot say "step or discrete").
        "spec": {
            "command": ["true"],
            "replicas": {"min": 2, "max": 4, "step": 2, "discrete": [2, 4]},
        },
    }
    create(plane, jobs, body)
    await eventually_async(
        lambda: status_if(plane, marker, lambda s: s.get("phase") == "Failed"),
        60,
        lambda: f"{marker} rejected; status {status(plane, marker)}",
    )


async def test_a_succeeded_job_never_runs_again_after_kubectl_label(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job = "ddp-done"
    created = create(plane, jobs, ddp_job(job, tmp_path, 20, replicas=ONE))
    assert created["metadata"]["generation"] == 1
    final = await eventually_async(
        lambda: status_if(plane, job, lambda s: s.get("phase") == "Succeeded"),
        120,
        lambda: f"{job} Succeeded; status {status(plane, job)}",
    )
    succeeded = [c for c in final.get("conditions") or [] if c["type"] == "Succeeded"]
    assert succeeded and succeeded[0]["status"] == "True", final
    assert final["submittedGeneration"] == 1, final
    await eventually_async(
        lambda: not labelled(plane, "pods", job), 60, lambda: f"{job}'s pods gone"
    )
    ran = runs_of(plane, job)
    assert len([e for e in events.of(JobSubmitted) if e.job == job]) == 1

    await label(plane, job, {"reviewed": "yes"})
    after = exists(plane, job)
    assert after is not None and after["metadata"]["labels"]["reviewed"] == "yes"
    assert after["metadata"]["generation"] == 1, "a label is not the spec"
    await acted_on(plane, jobs, "marker-done")

    assert len([e for e in events.of(JobSubmitted) if e.job == job]) == 1, "submitted again"
    assert status(plane, job)["phase"] == "Succeeded"
    assert not labelled(plane, "pods", job) and runs_of(plane, job) == ran, "it ran again"


async def test_a_training_job_deleted_while_the_scaler_is_down_leaves_nothing_behind(
    plane: ControlPlane, events: Events, jobs: list[str], tmp_path: Path
) -> None:
    job = "ddp-orphan"
    create(plane, jobs, ddp_job(job, tmp_path, 4000, replicas=ONE))
    await events.wait_for(
        lambda items: [e for e in items if isinstance(e, ProcessStarted) and e.job == job], 120
    )
    assert labelled(plane, "pods", job) and labelled(plane, "services", job)
    assert FINALIZER in (exists(plane, job) or {})["metadata"]["finalizers"]
    ran = runs_of(plane, job)

    plane.kill("scaler")
    plane.api.delete("trainingjobs", job)
    held = exists(plane, job)
    assert held is not None and held["metadata"].get("deletionTimestamp"), "held for cleanup"
    plane.restart("scaler")

    await eventually_async(
        lambda: not exists(plane, job) and not labelled(plane, "pods", job),
        120,
        lambda: f"{job} and its pods gone: {exists(plane, job)}, {labelled(plane, 'pods', job)}",
    )
    assert not labelled(plane, "services", job)
    kubelet = plane.kubelet
    assert kubelet is not None
    await eventually_async(
        lambda: not any(r.pids() for r in kubelet.runs.values() if r.pod["metadata"]["uid"] in ran),
        60,
        f"the processes of {job}'s pod ended",
    )

    def forgotten() -> bool:
        views = json.loads(plane.cli("status", "--json", "--once"))
        return not any(v.get("name") == job for v in views)

    await eventually_async(forgotten, 60, f"{job}'s record deleted")
    await acted_on(plane, jobs, "marker-orphan")
    assert runs_of(plane, job) == ran, "a pod was made for the deleted job"
