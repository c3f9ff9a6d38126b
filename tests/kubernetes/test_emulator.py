"""The test-side API server behaves as a real one for the official client, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import kubernetes.client as client
import kubernetes.config as config
import kubernetes.watch as watch
import pytest
from kubernetes.client.exceptions import ApiException

from resurge.jobspec.crd import training_job_crd
from tests.kubernetes.conftest import GPU, NOT_READY_TAINT, KubeApi
from tests.kubernetes.emulator import ClusterEmulator

REPO_ROOT = Path(__file__).resolve().parents[2]
NS = "default"
TJ = ("resurge.dev", "v1alpha1")


def raw(obj: Any) -> Any:
    """A client model as the plain JSON the server sent."""
    return client.ApiClient().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]


def reason(exc: ApiException) -> str:
    """The reason of the Status a failed call got."""
    return str(json.loads(exc.body or "{}")["reason"])


def new_watch() -> Any:
    return watch.Watch()  # type: ignore[no-untyped-call]


def core(api: KubeApi) -> client.CoreV1Api:
    return client.CoreV1Api(api.api_client())


def custom(api: KubeApi) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api.api_client())


def pod(
    name: str,
    labels: dict[str, str] | None = None,
    node: str | None = None,
    owner: dict[str, Any] | None = None,
) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            labels=labels,
            owner_references=[client.V1OwnerReference(**owner)] if owner else None,
        ),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name="worker", image="busybox")], node_name=node
        ),
    )


def training_job(name: str, replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"command": ["python", "train.py"], "replicas": {"min": 1, "max": replicas}},
    }


def events(stream: Iterator[dict[str, Any]], count: int, w: Any) -> list[tuple[str, str]]:
    """The first ``count`` events of a watch stream as (type, name); stops the watch."""
    seen: list[tuple[str, str]] = []
    for event in stream:
        seen.append((event["type"], event["raw_object"]["metadata"]["name"]))
        if len(seen) == count:
            w.stop()
    return seen


# -- objects ------------------------------------------------------------------------------


async def test_create_get_list_patch_delete_stamp_uid_and_resource_versions(
    kube_api: KubeApi,
) -> None:
    """API concepts, "Resource versions"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions) and Object
    Names and IDs, "UIDs": every write gets a new, increasing resourceVersion, which lists carry
    too; every object a uid."""
    api = core(kube_api)
    created = raw(await asyncio.to_thread(api.create_namespaced_pod, NS, pod("a")))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"]
    assert meta["namespace"] == NS and created["status"] == {"phase": "Pending"}
    first_rv = int(meta["resourceVersion"])
    stored = kube_api.emulator.objects["v1/pods", NS, "a"]
    assert stored["metadata"]["resourceVersion"] == meta["resourceVersion"]
    assert stored["metadata"]["creationTimestamp"].endswith("Z")

    fetched = raw(await asyncio.to_thread(api.read_namespaced_pod, "a", NS))
    assert fetched == created

    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("b"))
    listed = raw(await asyncio.to_thread(api.list_namespaced_pod, NS))
    assert [item["metadata"]["name"] for item in listed["items"]] == ["a", "b"]
    assert int(listed["metadata"]["resourceVersion"]) == kube_api.emulator.resource_version
    assert int(listed["metadata"]["resourceVersion"]) > first_rv

    patched = raw(
        await asyncio.to_thread(
            api.patch_namespaced_pod, "a", NS, {"metadata": {"labels": {"x": "1"}}}
        )
    )
    assert patched["metadata"]["labels"] == {"x": "1"}
    assert patched["metadata"]["uid"] == meta["uid"]
    assert int(patched["metadata"]["resourceVersion"]) > int(listed["metadata"]["resourceVersion"])
    # A patch that changes nothing writes nothing, as on a real server.
    same = raw(
        await asyncio.to_thread(
            api.patch_namespaced_pod, "a", NS, {"metadata": {"labels": {"x": "1"}}}
        )
    )
    assert same["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]

    with pytest.raises(ApiException) as conflict:
        await asyncio.to_thread(api.create_namespaced_pod, NS, pod("a"))
    assert conflict.value.status == 409
    assert reason(conflict.value) == "AlreadyExists"

    await asyncio.to_thread(api.delete_namespaced_pod, "a", NS)
    with pytest.raises(ApiException) as missing:
        await asyncio.to_thread(api.read_namespaced_pod, "a", NS)
    assert missing.value.status == 404
    assert reason(missing.value) == "NotFound"
    assert [p["metadata"]["name"] for p in kube_api.objects("pods")] == ["b"]


def test_a_replace_with_a_stale_resource_version_conflicts(kube_api_thread: KubeApi) -> None:
    """API concepts, "Resource versions"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions): an update
    whose resourceVersion is not the stored one is refused with 409 Conflict."""
    leases = client.CoordinationV1Api(kube_api_thread.api_client())
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"),
        spec=client.V1LeaseSpec(holder_identity="one"),
    )
    created = leases.create_namespaced_lease(NS, body)
    assert created.metadata is not None and created.spec is not None
    created.spec.holder_identity = "two"
    replaced = leases.replace_namespaced_lease("leader", NS, created)
    assert replaced.spec is not None and replaced.spec.holder_identity == "two"

    created.spec.holder_identity = "three"  # still carries the first resourceVersion
    with pytest.raises(ApiException) as stale:
        leases.replace_namespaced_lease("leader", NS, created)
    assert stale.value.status == 409
    assert reason(stale.value) == "Conflict"
    assert kube_api_thread.get("leases", "leader", NS)["spec"]["holderIdentity"] == "two"


def test_json_patch_and_strategic_merge_of_conditions(kube_api_thread: KubeApi) -> None:
    """Update API Objects in Place Using kubectl patch
    (https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/):
    a JSON patch (RFC 6902, its ``test`` op failing with 422) and a strategic merge patch, which
    merges lists by their patch merge key (conditions by ``type``) and replaces those without
    one (taints)."""
    api = core(kube_api_thread)
    api.create_namespaced_pod(NS, pod("a", labels={"keep": "1"}))

    # A list body goes as a JSON patch.
    api.patch_namespaced_pod("a", NS, [{"op": "add", "path": "/metadata/labels/new", "value": "2"}])
    assert kube_api_thread.get("pods", "a", NS)["metadata"]["labels"] == {"keep": "1", "new": "2"}
    with pytest.raises(ApiException) as failed:
        api.patch_namespaced_pod("a", NS, [{"op": "test", "path": "/metadata/name", "value": "b"}])
    assert failed.value.status == 422

    # A dict body goes as a strategic merge patch: conditions merge by type.
    ready = {"type": "Ready", "status": "True"}
    scheduled = {"type": "PodScheduled", "status": "True"}
    api.patch_namespaced_pod_status("a", NS, {"status": {"conditions": [ready]}})
    api.patch_namespaced_pod_status("a", NS, {"status": {"conditions": [scheduled]}})
    conditions = kube_api_thread.get("pods", "a", NS)["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Ready", "PodScheduled"]

    # Taints have no merge key: a strategic merge replaces the list, as on a real server.
    kube_api_thread.add_node("n1")
    taint = {"key": "a", "effect": "NoSchedule"}
    api.patch_node("n1", {"spec": {"taints": [taint]}})
    api.patch_node("n1", {"spec": {"taints": [{**taint, "key": "b"}]}})
    assert [t["key"] for t in kube_api_thread.get("nodes", "n1")["spec"]["taints"]] == ["b"]


# -- status and subresources --------------------------------------------------------------


def test_status_subresource_changes_only_status(kube_api_thread: KubeApi) -> None:
    """API conventions, "Spec and Status"
    (https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#spec-and-status):
    a write to /status changes only status, one to the object everything but status."""
    api = core(kube_api_thread)
    api.create_namespaced_pod(NS, pod("a"))

    api.patch_namespaced_pod_status(
        "a", NS, {"metadata": {"labels": {"ignored": "1"}}, "status": {"phase": "Running"}}
    )
    after_status = kube_api_thread.get("pods", "a", NS)
    assert after_status["status"]["phase"] == "Running"
    assert "labels" not in after_status["metadata"]

    api.patch_namespaced_pod(
        "a", NS, {"metadata": {"labels": {"kept": "1"}}, "status": {"phase": "Failed"}}
    )
    after_main = kube_api_thread.get("pods", "a", NS)
    assert after_main["status"]["phase"] == "Running"
    assert after_main["metadata"]["labels"] == {"kept": "1"}

    current = api.read_namespaced_pod("a", NS)
    assert current.status is not None and current.metadata is not None
    current.status.phase = "Succeeded"
    current.metadata.labels = {}
    api.replace_namespaced_pod_status("a", NS, current)
    after_put = kube_api_thread.get("pods", "a", NS)
    assert after_put["status"]["phase"] == "Succeeded"
    assert after_put["metadata"]["labels"] == {"kept": "1"}


def test_every_registered_core_kind_serves_create_list_delete(kube_api_thread: KubeApi) -> None:
    """API concepts, "Kubernetes API terminology"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#standard-api-terminology):
    each kind serves create, list and delete at its collection and object URLs."""
    api = core(kube_api_thread)
    meta = client.V1ObjectMeta(name="x")
    api.create_namespaced_config_map(NS, client.V1ConfigMap(metadata=meta, data={"k": "v"}))
    api.create_namespaced_service(
        NS, client.V1Service(metadata=meta, spec=client.V1ServiceSpec(cluster_ip="None"))
    )
    involved = client.V1ObjectReference(kind="Pod", name="p", namespace=NS)
    api.create_namespaced_event(
        NS, client.CoreV1Event(metadata=meta, involved_object=involved, reason="Started")
    )
    for kind in ("configmaps", "services", "events"):
        assert [o["metadata"]["name"] for o in kube_api_thread.objects(kind, NS)] == ["x"]
    reasons = raw(api.list_namespaced_event(NS, field_selector="involvedObject.name=p"))
    assert [e["reason"] for e in reasons["items"]] == ["Started"]

    gone: Any = api.delete_namespaced_config_map("x", NS)
    assert gone["kind"] == "Status" and gone["status"] == "Success"  # as a real server
    deleted_service = api.delete_namespaced_service("x", NS)
    assert deleted_service.metadata is not None and deleted_service.metadata.name == "x"
    assert kube_api_thread.objects("configmaps") == [] and kube_api_thread.objects("svc") == []


def test_custom_objects_on_trainingjobs(kube_api_thread: KubeApi) -> None:
    """CustomResourceDefinitions, "Status subresource"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#status-subresource):
    a create drops status, a status write is no new generation, a spec write is; no scale
    subresource where the CRD declares none."""
    api = custom(kube_api_thread)
    created: Any = api.create_namespaced_custom_object(*TJ, NS, "trainingjobs", training_job("j"))
    assert created["metadata"]["generation"] == 1 and created["metadata"]["uid"]
    assert "status" not in created  # a create drops .status when there is a status subresource

    status: Any = api.patch_namespaced_custom_object_status(
        *TJ, NS, "trainingjobs", "j", {"status": {"phase": "Running", "replicas": {"current": 2}}}
    )
    assert status["status"]["phase"] == "Running"
    assert status["metadata"]["generation"] == 1  # a status change is no new generation

    spec: Any = api.patch_namespaced_custom_object(
        *TJ, NS, "trainingjobs", "j", {"spec": {"monitoring": {"heartbeatTimeoutSeconds": 90}}}
    )
    assert spec["spec"]["monitoring"]["heartbeatTimeoutSeconds"] == 90
    assert spec["metadata"]["generation"] == 2
    assert spec["status"]["phase"] == "Running"

    listed: Any = api.list_namespaced_custom_object(*TJ, NS, "trainingjobs")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["j"]
    assert listed["metadata"]["resourceVersion"] == spec["metadata"]["resourceVersion"]

    with pytest.raises(ApiException) as no_scale:  # the CRD declares no scale subresource
        api.get_namespaced_custom_object_scale(*TJ, NS, "trainingjobs", "j")
    assert no_scale.value.status == 404

    api.patch_namespaced_custom_object_status(
        *TJ, NS, "trainingjobs", "j", {"status": {"phase": "Succeeded"}}
    )
    stale = {**spec, "spec": {"replicas": {"min": 1, "max": 8}}}  # an old resourceVersion
    with pytest.raises(ApiException) as conflict:
        api.replace_namespaced_custom_object(*TJ, NS, "trainingjobs", "j", stale)
    assert conflict.value.status == 409

    api.delete_namespaced_custom_object(*TJ, NS, "trainingjobs", "j")
    assert kube_api_thread.objects("trainingjobs") == []


def test_trainingjobs_are_registered_as_the_crd_declares_them(kube_api_thread: KubeApi) -> None:
    """The Kubernetes API, "Discovery API"
    (https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api): the custom
    resource is served with the names, scope, subresources and schema of the CRD the product
    generates."""
    crd = training_job_crd()  # what deploy/crds/trainingjobs.yaml is generated from
    names, version = crd["spec"]["names"], crd["spec"]["versions"][0]
    kind = kube_api_thread.emulator.kind("trainingjobs")
    assert (kind.group, kind.version) == (crd["spec"]["group"], version["name"])
    assert (kind.plural, kind.singular, kind.kind) == (
        names["plural"],
        names["singular"],
        names["kind"],
    )
    assert list(kind.shortnames) == names["shortNames"]
    assert kind.namespaced == (crd["spec"]["scope"] == "Namespaced")
    assert set(version["subresources"]) == set(kind.subresources)
    assert kind.schema == version["schema"]["openAPIV3Schema"]

    found: Any = client.CustomObjectsApi(kube_api_thread.api_client()).get_api_resources(*TJ)
    by_name = {r.name: r for r in found.resources}
    assert by_name["trainingjobs"].short_names == ["tj"] and by_name["trainingjobs"].namespaced
    assert {f"trainingjobs/{sub}" for sub in version["subresources"]} <= set(by_name)
    core_found = raw(core(kube_api_thread).get_api_resources())
    assert core_found["groupVersion"] == "v1"
    scopes = {r["name"]: r["namespaced"] for r in core_found["resources"]}
    assert scopes["nodes"] is False
    assert all(scopes[name] for name in ("pods", "services", "events", "configmaps"))


# -- watches ------------------------------------------------------------------------------


async def test_watch_from_a_resource_version_sends_only_later_events(kube_api: KubeApi) -> None:
    """API concepts, "Efficient detection of changes"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
    a watch from a resourceVersion sends the changes after it."""
    api = core(kube_api)
    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("before"))
    rv = raw(await asyncio.to_thread(api.list_namespaced_pod, NS))["metadata"]["resourceVersion"]
    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("after"))
    await asyncio.to_thread(api.delete_namespaced_pod, "before", NS)

    w = new_watch()
    stream = w.stream(api.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=10)
    seen = await asyncio.to_thread(events, stream, 2, w)
    assert seen == [("ADDED", "after"), ("DELETED", "before")]
    assert int(w.resource_version) == kube_api.emulator.resource_version


async def test_watch_without_a_resource_version_replays_then_follows(kube_api: KubeApi) -> None:
    """API concepts, "Semantics for watch"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#semantics-for-watch): a watch
    without a resourceVersion starts with every object as ADDED, then follows."""
    api = core(kube_api)
    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("old"))
    w = new_watch()
    stream = w.stream(api.list_namespaced_pod, NS, timeout_seconds=10)
    consumer = asyncio.create_task(asyncio.to_thread(events, stream, 2, w))
    await kube_api.wait_for_watch("pods")
    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("new"))
    assert await consumer == [("ADDED", "old"), ("ADDED", "new")]


def test_watch_reconnects_after_break_without_missing_an_event(kube_api_thread: KubeApi) -> None:
    """API concepts, "Efficient detection of changes"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
    a watch the server ends is resumed from the last resourceVersion seen, missing nothing."""
    api = core(kube_api_thread)
    api.create_namespaced_pod(NS, pod("a"))
    rv = raw(api.list_namespaced_pod(NS))["metadata"]["resourceVersion"]
    api.create_namespaced_pod(NS, pod("b"))

    def break_then_create(em: ClusterEmulator) -> int:
        broken = em.break_watches()
        em.create_object("pods", raw(pod("c")), NS)  # while nothing watches
        return broken

    w = new_watch()
    seen: list[str] = []
    broken: list[int] = []
    # No timeout_seconds: the client reconnects by itself from its last resourceVersion.
    for event in w.stream(api.list_namespaced_pod, NS, resource_version=rv, _request_timeout=30):
        seen.append(event["raw_object"]["metadata"]["name"])
        if seen == ["b"]:
            broken.append(kube_api_thread.call(break_then_create))
        if len(seen) == 2:
            w.stop()
    assert broken == [1]
    assert seen == ["b", "c"]


async def test_a_watch_with_timeout_seconds_ends_at_a_break_and_resumes(kube_api: KubeApi) -> None:
    """API concepts, "Efficient detection of changes"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
    a watch ends at the server's will, before its timeoutSeconds, and resumes from its last
    resourceVersion."""
    api = core(kube_api)
    w = new_watch()
    stream = w.stream(api.list_namespaced_pod, NS, resource_version="0", timeout_seconds=30)
    consumer = asyncio.create_task(asyncio.to_thread(lambda: [e["type"] for e in stream]))
    await kube_api.wait_for_watch("pods")
    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("seen"))
    assert kube_api.break_watches() == 1
    assert await asyncio.wait_for(consumer, 10) == ["ADDED"]  # ended by the break, not at 30 s

    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("missed"))
    resumed = w.stream(
        api.list_namespaced_pod, NS, resource_version=w.resource_version, timeout_seconds=10
    )
    assert await asyncio.to_thread(events, resumed, 1, w) == [("ADDED", "missed")]


def test_a_watch_from_before_a_compaction_is_expired_with_410(kube_api_thread: KubeApi) -> None:
    """API concepts, "Efficient detection of changes"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
    a watch from a version older than the server keeps gets an ERROR event with a 410 Gone
    (Expired) Status; the client lists again and watches from the list's version."""
    api = core(kube_api_thread)
    api.create_namespaced_pod(NS, pod("a"))
    old = raw(api.list_namespaced_pod(NS))["metadata"]["resourceVersion"]
    api.create_namespaced_pod(NS, pod("b"))
    compacted = kube_api_thread.compact()

    # On the wire: 200, then one ERROR event with a Status 410 Expired, as a real server.
    response: Any = api.list_namespaced_pod(
        NS, watch=True, resource_version=old, _preload_content=False, _request_timeout=10
    )
    assert response.status == 200
    lines = [json.loads(line) for line in response.data.decode().splitlines() if line]
    assert lines == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {old} ({compacted})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]

    # The official client raises ApiException(410) out of the stream, with timeout_seconds...
    with pytest.raises(ApiException) as expired:
        list(
            new_watch().stream(api.list_namespaced_pod, NS, resource_version=old, timeout_seconds=5)
        )
    assert expired.value.status == 410 and "Expired" in str(expired.value.reason)
    # ... and without, after one retry from the same version.
    with pytest.raises(ApiException) as retried:
        list(
            new_watch().stream(
                api.list_namespaced_pod, NS, resource_version=old, _request_timeout=10
            )
        )
    assert retried.value.status == 410

    # From the compacted version on, watching works: list again, watch from the list.
    fresh = raw(api.list_namespaced_pod(NS))["metadata"]["resourceVersion"]
    api.create_namespaced_pod(NS, pod("c"))
    w = new_watch()
    stream = w.stream(api.list_namespaced_pod, NS, resource_version=fresh, timeout_seconds=10)
    assert events(stream, 1, w) == [("ADDED", "c")]


# -- selectors ----------------------------------------------------------------------------


def test_label_and_field_selectors_filter_lists(kube_api_thread: KubeApi) -> None:
    """Labels and Selectors
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors)
    and Field Selectors
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/): lists
    return only the objects the selectors match."""
    api = core(kube_api_thread)
    api.create_namespaced_pod(NS, pod("a", labels={"job": "j1", "role": "worker"}, node="n1"))
    api.create_namespaced_pod(NS, pod("b", labels={"job": "j1"}, node="n2"))
    api.create_namespaced_pod(NS, pod("c", labels={"job": "j2", "role": "worker"}))
    api.create_namespaced_pod("other", pod("d", labels={"job": "j1"}, node="n1"))

    def names(label_selector: str | None = None, field_selector: str | None = None) -> list[str]:
        found = api.list_pod_for_all_namespaces(
            label_selector=label_selector, field_selector=field_selector
        )
        items = raw(found)["items"]
        return [item["metadata"]["name"] for item in items]

    assert names(label_selector="job=j1") == ["a", "b", "d"]
    assert names(label_selector="job!=j1") == ["c"]
    assert names(label_selector="job=j1,role") == ["a"]
    assert names(label_selector="!role") == ["b", "d"]
    assert names(label_selector="job in (j2, j3)") == ["c"]
    assert names(field_selector="spec.nodeName=n1") == ["a", "d"]
    assert names(field_selector="spec.nodeName=") == ["c"]
    assert names(field_selector="metadata.namespace=other") == ["d"]
    assert names(field_selector="metadata.name=b,spec.nodeName!=n1") == ["b"]
    assert names(label_selector="job=j1", field_selector="spec.nodeName=n1") == ["a", "d"]
    with pytest.raises(ApiException) as unsupported:
        names(field_selector="spec.image=busybox")
    assert unsupported.value.status == 400


async def test_a_watch_with_a_selector_sees_objects_enter_and_leave(kube_api: KubeApi) -> None:
    """API concepts, "Efficient detection of changes"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes)
    with a label selector: an object that comes to match is ADDED for the watch, one that stops
    matching DELETED."""
    api = core(kube_api)
    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("bystander"))
    rv = raw(await asyncio.to_thread(api.list_namespaced_pod, NS))["metadata"]["resourceVersion"]
    assert rv != "0"  # "0" would mean "any version": a replay of what is there now
    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("other", labels={"job": "j2"}))
    await asyncio.to_thread(api.create_namespaced_pod, NS, pod("mine", labels={"job": "j1"}))
    await asyncio.to_thread(
        api.patch_namespaced_pod, "other", NS, {"metadata": {"labels": {"job": "j1"}}}
    )
    await asyncio.to_thread(
        api.patch_namespaced_pod, "mine", NS, {"metadata": {"labels": {"job": "j3"}}}
    )
    w = new_watch()
    stream = w.stream(
        api.list_namespaced_pod,
        NS,
        resource_version=rv,
        label_selector="job=j1",
        timeout_seconds=10,
    )
    seen = await asyncio.to_thread(events, stream, 3, w)
    assert seen == [("ADDED", "mine"), ("ADDED", "other"), ("DELETED", "mine")]

    w = new_watch()
    stream = w.stream(
        api.list_namespaced_pod,
        NS,
        resource_version=rv,
        field_selector="metadata.name=other",
        timeout_seconds=10,
    )
    seen = await asyncio.to_thread(events, stream, 2, w)
    assert seen == [("ADDED", "other"), ("MODIFIED", "other")]


# -- deletion -----------------------------------------------------------------------------


def test_deleting_an_owner_deletes_its_dependents(kube_api_thread: KubeApi) -> None:
    """Garbage Collection, "Owners and dependents"
    (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#owners-dependents):
    deleting an owner deletes the objects whose ownerReferences name it."""
    api = core(kube_api_thread)
    job: Any = custom(kube_api_thread).create_namespaced_custom_object(
        *TJ, NS, "trainingjobs", training_job("j")
    )
    owner = {
        "api_version": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "name": "j",
        "uid": job["metadata"]["uid"],
    }
    api.create_namespaced_pod(NS, pod("worker-0", owner=owner))
    api.create_namespaced_pod(NS, pod("worker-1", owner=owner))
    api.create_namespaced_pod(NS, pod("unrelated"))
    rv = raw(api.list_namespaced_pod(NS))["metadata"]["resourceVersion"]

    custom(kube_api_thread).delete_namespaced_custom_object(*TJ, NS, "trainingjobs", "j")
    assert [p["metadata"]["name"] for p in kube_api_thread.objects("pods")] == ["unrelated"]
    w = new_watch()
    stream = w.stream(api.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=10)
    assert sorted(events(stream, 2, w)) == [("DELETED", "worker-0"), ("DELETED", "worker-1")]


def test_an_orphaning_delete_keeps_the_dependents(kube_api_thread: KubeApi) -> None:
    """Garbage Collection, "Cascading deletion"
    (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#cascading-deletion):
    with propagationPolicy Orphan the dependents stay, their ownerReference removed."""
    api = core(kube_api_thread)
    job: Any = custom(kube_api_thread).create_namespaced_custom_object(
        *TJ, NS, "trainingjobs", training_job("j")
    )
    owner = {"api_version": "resurge.dev/v1alpha1", "kind": "TrainingJob", "name": "j"}
    api.create_namespaced_pod(NS, pod("worker", owner={**owner, "uid": job["metadata"]["uid"]}))
    custom(kube_api_thread).delete_namespaced_custom_object(
        *TJ, NS, "trainingjobs", "j", propagation_policy="Orphan"
    )
    (kept,) = kube_api_thread.objects("pods")
    assert "ownerReferences" not in kept["metadata"]


def test_finalizers_hold_a_deletion_until_removed(kube_api_thread: KubeApi) -> None:
    """Finalizers (https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/):
    a delete of an object with finalizers only sets its deletionTimestamp; it goes when the last
    finalizer is removed."""
    api = core(kube_api_thread)
    body = pod("held")
    assert body.metadata is not None
    body.metadata.finalizers = ["resurge.dev/cleanup"]
    api.create_namespaced_pod(NS, body)

    api.delete_namespaced_pod("held", NS)
    marked = kube_api_thread.get("pods", "held", NS)
    assert marked["metadata"]["deletionTimestamp"]

    api.patch_namespaced_pod("held", NS, [{"op": "remove", "path": "/metadata/finalizers"}])
    assert kube_api_thread.objects("pods") == []


# -- the helpers, the kubeconfig, other processes -----------------------------------------


def test_nodes_from_add_node_and_set_ready(kube_api_thread: KubeApi) -> None:
    """Nodes, "Node status" and "Taints" (https://kubernetes.io/docs/reference/node/node-status/):
    the fixture's nodes carry a Ready condition and the not-ready taints as the node lifecycle
    controller sets them."""
    kube_api_thread.add_node("n1", gpus=4, labels={"pool": "a"}, address="10.0.0.1")
    kube_api_thread.add_node("n2", ready=False)
    api = core(kube_api_thread)

    node = raw(api.read_node("n1"))
    assert node["status"]["allocatable"][GPU] == "4" and node["status"]["capacity"][GPU] == "4"
    assert node["metadata"]["labels"]["pool"] == "a"
    assert {"type": "InternalIP", "address": "10.0.0.1"} in node["status"]["addresses"]
    (ready,) = node["status"]["conditions"]
    assert ready["type"] == "Ready" and ready["status"] == "True" and ready["lastHeartbeatTime"]

    kube_api_thread.set_ready("n1", False)
    node = raw(api.read_node("n1"))
    assert node["status"]["conditions"][0]["status"] == "False"
    assert NOT_READY_TAINT in {t["key"] for t in node["spec"]["taints"]}
    kube_api_thread.set_ready("n2", True)
    node = raw(api.read_node("n2"))
    assert node["status"]["conditions"][0]["status"] == "True"
    assert node["spec"].get("taints") == []

    listed = raw(api.list_node(label_selector="pool=a"))
    assert [n["metadata"]["name"] for n in listed["items"]] == ["n1"]


def test_a_kubeconfig_and_a_subprocess_reach_the_server(kube_api_thread: KubeApi) -> None:
    """Organizing Cluster Access Using kubeconfig Files
    (https://kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/):
    another process reaches the server through the fixture's kubeconfig."""
    kube_api_thread.add_node("n1")
    config.load_kube_config(config_file=str(kube_api_thread.kubeconfig))  # type: ignore[no-untyped-call]
    assert [n["metadata"]["name"] for n in raw(client.CoreV1Api().list_node())["items"]] == ["n1"]
    _, context = config.list_kube_config_contexts(str(kube_api_thread.kubeconfig))  # type: ignore[no-untyped-call]
    assert context["context"]["namespace"] == NS

    script = (
        "from kubernetes import client, config\n"
        "config.load_kube_config()\n"
        "print(','.join(n.metadata.name for n in client.CoreV1Api().list_node().items))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **kube_api_thread.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "n1"


def test_a_reaction_added_by_a_test_overrides_the_emulator(kube_api_thread: KubeApi) -> None:
    """No Kubernetes rule: a test's own kmock reaction answers before the emulator (how a test
    makes the API fail)."""
    kube_api_thread.add_node("n1")
    emulator = kube_api_thread.emulator
    kube_api_thread.call(lambda em: em["get /api/v1/nodes"] << 503)
    with pytest.raises(ApiException) as failed:
        core(kube_api_thread).list_node()
    assert failed.value.status == 503
    assert isinstance(emulator, kmock.KubernetesEmulator)
