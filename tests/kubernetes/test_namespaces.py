"""One install serves every team's namespace: a TrainingJob outside the install's own
namespace is run, its pods, Service, Events and status in its own namespace; two teams'
jobs of one name both run, each under its own bus name (``team-b/llama``); deletion and
the sweep at start work in any namespace; ``RESURGE_KUBE_NAMESPACES`` narrows what is
served. Against the API emulator over real HTTP with the official client and a real
nats-server; the emulator lacks a scheduler and kubelets, so pods are made, never run.

Kubernetes scopes names by namespace ("Namespaces",
https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces/: "Names of
resources need to be unique within a namespace, but not across namespaces"), and an
owner must be in its dependent's namespace ("Owners and Dependents",
https://kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/:
"Cross-namespace owner references are disallowed by design").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from resurge.cluster import ClusterBackend, WorkerGroupSpec, open_backend
from resurge.cluster.kubernetes.backend import KubernetesBackend
from resurge.events import JobDeleted, JobSubmitted
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.collect import Events
from tests.kubernetes.conftest import KubeApi
from tests.kubernetes.helpers import Running, training_job, until

FINALIZER = "resurge.dev/cleanup"
TEAM_B = "team-b"


def group(job: str, replica: int, node: str) -> WorkerGroupSpec:
    return WorkerGroupSpec(job=job, replica=replica, node=node, nproc=2, command=["python"])


def in_namespace(name: str, namespace: str) -> dict[str, Any]:
    job = training_job(name)
    job["metadata"]["namespace"] = namespace
    return job


def labelled(api: KubeApi, kind: str, namespace: str | None, job: str) -> list[dict[str, Any]]:
    """The ``kind`` objects in ``namespace`` (None: any) labelled as job ``job``'s."""
    return [
        obj
        for obj in api.objects(kind, namespace)
        if obj["metadata"].get("labels", {}).get("resurge.dev/job") == job
    ]


def finalized(api: KubeApi, name: str, namespace: str) -> bool:
    meta = api.get("trainingjobs", name, namespace)["metadata"]
    return FINALIZER in (meta.get("finalizers") or [])


def exists(api: KubeApi, name: str, namespace: str) -> bool:
    return any(tj["metadata"]["name"] == name for tj in api.objects("trainingjobs", namespace))


def submitted(jobs: Events, name: str) -> list[JobSubmitted]:
    return [e for e in jobs.of(JobSubmitted) if e.job == name]


def deleted(jobs: Events, name: str) -> list[JobDeleted]:
    return [e for e in jobs.of(JobDeleted) if e.job == name]


async def test_a_training_job_in_another_namespace_runs_there(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running, jobs: Events
) -> None:
    """Item 5: a TrainingJob in ``team-b`` (the install's namespace is ``default``) is
    submitted as ``team-b/llama``; its pod and headless Service are made in ``team-b``,
    owned by it, the pods' domain is ``<service>.team-b.svc``; its status and Events
    are written on it in ``team-b``. Before: it was never seen."""
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", in_namespace("llama", TEAM_B))
    found = await jobs.wait_for(lambda items: submitted(jobs, "team-b/llama"))
    assert found
    spec = submitted(jobs, "team-b/llama")[0].spec
    assert (spec.metadata.namespace, spec.name) == (TEAM_B, "llama")
    assert isinstance(backend, KubernetesBackend)
    assert backend.worker_domain(spec) == "llama.team-b.svc"
    await until("the finalizer", lambda: finalized(kube_api_thread, "llama", TEAM_B))
    await until(
        "submittedGeneration",
        lambda: (
            kube_api_thread.get("trainingjobs", "llama", TEAM_B)
            .get("status", {})
            .get("submittedGeneration")
            == 1
        ),
    )

    await backend.create_worker_group(
        group("team-b/llama", 0, "n1").model_copy(update={"domain": "llama.team-b.svc"})
    )
    pods = await until("its pod", lambda: labelled(kube_api_thread, "pods", TEAM_B, "llama"))
    owner = kube_api_thread.get("trainingjobs", "llama", TEAM_B)["metadata"]["uid"]
    assert [r["uid"] for r in pods[0]["metadata"]["ownerReferences"]] == [owner]
    assert pods[0]["spec"]["subdomain"] == "llama"
    services = labelled(kube_api_thread, "services", TEAM_B, "llama")
    assert [s["metadata"]["name"] for s in services] == ["llama"]
    assert not labelled(kube_api_thread, "pods", "default", "llama")

    running = {
        "name": "team-b/llama",
        "phase": "Running",
        "generation": 1,
        "replicas": {"current": 1, "target": 1},
        "message": "generation 1 running",
    }
    await backend.write_job_status("team-b/llama", running)
    await backend.write_job_status("team-b/llama", {**running, "phase": "Succeeded"})
    status = kube_api_thread.get("trainingjobs", "llama", TEAM_B)["status"]
    assert status["phase"] == "Succeeded", status
    events = [e for e in kube_api_thread.objects("events", TEAM_B) if e["reason"] == "Succeeded"]
    assert [e["involvedObject"]["name"] for e in events] == ["llama"], events
    assert not kube_api_thread.objects("events", "default")


async def test_two_teams_jobs_of_one_name_both_run(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running, jobs: Events
) -> None:
    """Item 5: ``llama`` in ``default`` (the install's namespace) and ``llama`` in
    ``team-b`` are two jobs on the bus, ``llama`` and ``team-b/llama``; each gets its
    pod in its namespace, on the same node, and deleting one leaves the other's pods and
    TrainingJob alone. Before: team-b's was never seen."""
    kube_api_thread.add_node("n1", gpus=8)
    kube_api_thread.create("trainingjobs", training_job("llama"))
    kube_api_thread.create("trainingjobs", in_namespace("llama", TEAM_B))
    await jobs.wait_for(lambda items: submitted(jobs, "llama") and submitted(jobs, "team-b/llama"))
    for namespace in ("default", TEAM_B):
        await until(
            f"{namespace}'s finalizer",
            lambda n=namespace: finalized(kube_api_thread, "llama", n),  # type: ignore[misc]
        )
    await backend.create_worker_group(group("llama", 0, "n1"))
    await backend.create_worker_group(group("team-b/llama", 0, "n1"))
    await until(
        "a pod in each namespace",
        lambda: (
            labelled(kube_api_thread, "pods", "default", "llama")
            and labelled(kube_api_thread, "pods", TEAM_B, "llama")
        ),
    )

    kube_api_thread.delete("trainingjobs", "llama", TEAM_B)
    await jobs.wait_for(lambda items: deleted(jobs, "team-b/llama"))
    await until("team-b's gone", lambda: not exists(kube_api_thread, "llama", TEAM_B))
    assert not labelled(kube_api_thread, "pods", TEAM_B, "llama")
    assert not labelled(kube_api_thread, "services", TEAM_B, "llama")
    assert not deleted(jobs, "llama"), "the other team's job was told deleted"
    assert labelled(kube_api_thread, "pods", "default", "llama"), "the other team's pod went"
    assert exists(kube_api_thread, "llama", "default")


async def test_a_job_deleted_in_another_namespace_while_the_controller_was_down(
    kube_api_thread: KubeApi, backend: ClusterBackend, controller: Running, jobs: Events
) -> None:
    """Item 5, the finalizer and the sweep at start in a namespace not the install's:
    deleted while no controller runs, team-b's TrainingJob is cleaned up and let go by
    the restarted controller, and a pod left without owner in team-b is swept."""
    kube_api_thread.add_node("n1", gpus=4)
    kube_api_thread.create("trainingjobs", in_namespace("held", TEAM_B))
    await until("the finalizer", lambda: finalized(kube_api_thread, "held", TEAM_B))
    await backend.create_worker_group(group("team-b/held", 0, "n1"))
    await until("its pod", lambda: labelled(kube_api_thread, "pods", TEAM_B, "held"))
    kube_api_thread.create(
        "pods",
        {
            "metadata": {"name": "stale-0-abcde", "labels": {"resurge.dev/job": "stale"}},
            "spec": {"containers": [{"name": "agent", "image": "resurge:latest"}]},
        },
        TEAM_B,
    )

    await controller.stop()
    kube_api_thread.delete("trainingjobs", "held", TEAM_B)
    assert exists(kube_api_thread, "held", TEAM_B), "held by the finalizer"
    controller.start()
    await jobs.wait_for(lambda items: deleted(jobs, "team-b/held"))
    await until("held gone", lambda: not exists(kube_api_thread, "held", TEAM_B))
    await until("no pod left in team-b", lambda: not kube_api_thread.objects("pods", TEAM_B))


@pytest.fixture
async def team_a_only(
    kube_api_thread: KubeApi, bus: Bus, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Running]:
    """The controller of an install that serves only ``team-a``
    (``RESURGE_KUBE_NAMESPACES=team-a``)."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kube_api_thread.kubeconfig))
    monkeypatch.setenv("RESURGE_KUBE_NAMESPACES", "team-a")
    chosen = Settings().model_copy(
        update={"cluster": "kubernetes", "namespace": settings.namespace}
    )
    assert chosen.kube_namespaces == "team-a"
    running = Running(await open_backend(bus, chosen))
    running.start()
    yield running
    await running.stop()


async def test_a_configured_namespace_list_leaves_the_other_namespaces_alone(
    kube_api_thread: KubeApi, team_a_only: Running, jobs: Events
) -> None:
    """``RESURGE_KUBE_NAMESPACES=team-a``: team-a's TrainingJob is run, team-b's and
    default's are left as they are (no finalizer, no submission: another install may
    serve them)."""
    kube_api_thread.create("trainingjobs", in_namespace("other", TEAM_B))
    kube_api_thread.create("trainingjobs", training_job("home"))
    kube_api_thread.create("trainingjobs", in_namespace("mine", "team-a"))
    await jobs.wait_for(lambda items: submitted(jobs, "team-a/mine"))
    await until("team-a's finalizer", lambda: finalized(kube_api_thread, "mine", "team-a"))
    # One watch of every namespace would have delivered (and the controller acted on)
    # the two made first before this one.
    assert not submitted(jobs, "team-b/other") and not submitted(jobs, "home")
    assert not finalized(kube_api_thread, "other", TEAM_B)
    assert not finalized(kube_api_thread, "home", "default")
