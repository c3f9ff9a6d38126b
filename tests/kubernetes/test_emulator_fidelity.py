"""The emulator follows the Kubernetes API where a real server is stricter or says more than a
plain object store: each test names the API documentation it follows."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client as client
import kubernetes.watch as watch

from tests.kubernetes.conftest import KubeApi

NS = "default"


def core(api: KubeApi) -> Any:
    """The official client's CoreV1Api, typed loosely: these tests pass it plain dicts."""
    return client.CoreV1Api(api.api_client())


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "worker", "image": "busybox"}]},
    }


def watch_lines(api: Any, **params: Any) -> list[dict[str, Any]]:
    """Every event of one pod watch, as the server sent it, until the server ends it."""
    response: Any = api.list_namespaced_pod(
        NS, watch=True, _preload_content=False, _request_timeout=30, **params
    )
    return [json.loads(line) for line in response.data.decode().splitlines() if line]


# -- watch bookmarks ----------------------------------------------------------------------


def test_a_watch_asking_for_bookmarks_gets_one_before_it_times_out(
    kube_api_thread: KubeApi,
) -> None:
    """API concepts, "Watch bookmarks"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks): with
    ``allowWatchBookmarks=true`` the server may send BOOKMARK events, whose object holds
    only kind, apiVersion and ``metadata.resourceVersion``, meaning every change up to
    that version was sent. The apiserver sends one just before a watch's timeout."""
    kube_api_thread.call(lambda em: setattr(em, "bookmark_interval", 3600.0))
    api = core(kube_api_thread)
    rv = api.list_namespaced_pod(NS).metadata.resource_version
    api.create_namespaced_pod(NS, pod("a"))
    kube_api_thread.create("configmaps", {"metadata": {"name": "elsewhere"}})

    lines = watch_lines(api, resource_version=rv, timeout_seconds=1, allow_watch_bookmarks=True)
    assert [line["type"] for line in lines] == ["ADDED", "BOOKMARK"]
    assert lines[-1]["object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(kube_api_thread.emulator.resource_version)},
    }
    # Without asking, none.
    plain = watch_lines(api, resource_version=rv, timeout_seconds=1)
    assert [line["type"] for line in plain] == ["ADDED"]


def test_a_watch_asking_for_bookmarks_gets_them_periodically(kube_api_thread: KubeApi) -> None:
    """API concepts, "Watch bookmarks"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks): the
    apiserver's watch cache sends a bookmark about every minute on a quiet watch; the
    emulator every ``bookmark_interval`` seconds."""
    kube_api_thread.call(lambda em: setattr(em, "bookmark_interval", 0.2))
    api = core(kube_api_thread)
    rv = api.list_namespaced_pod(NS).metadata.resource_version

    lines = watch_lines(api, resource_version=rv, timeout_seconds=2, allow_watch_bookmarks=True)
    assert {line["type"] for line in lines} == {"BOOKMARK"}
    assert len(lines) >= 3  # periodic ones, then the one at the timeout


def test_a_watch_resumed_from_a_bookmark_misses_nothing(kube_api_thread: KubeApi) -> None:
    """API concepts, "Watch bookmarks"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks): a
    bookmark's resourceVersion is where a client resumes its watch; the official client's
    ``Watch`` keeps it, and a watch resumed there sends what came after and nothing before."""
    kube_api_thread.call(lambda em: setattr(em, "bookmark_interval", 0.2))
    api = core(kube_api_thread)
    api.create_namespaced_pod(NS, pod("before"))
    rv = api.list_namespaced_pod(NS).metadata.resource_version
    kube_api_thread.create("configmaps", {"metadata": {"name": "moves-the-version"}})

    w: Any = watch.Watch()  # type: ignore[no-untyped-call]
    quiet = list(
        w.stream(
            api.list_namespaced_pod,
            NS,
            resource_version=rv,
            timeout_seconds=1,
            allow_watch_bookmarks=True,
        )
    )
    assert {event["type"] for event in quiet} == {"BOOKMARK"}
    assert int(w.resource_version) > int(rv)  # moved on by the bookmarks alone

    api.create_namespaced_pod(NS, pod("after"))
    resumed = w.stream(
        api.list_namespaced_pod, NS, resource_version=w.resource_version, timeout_seconds=5
    )
    first = next(iter(resumed))
    w.stop()
    assert (first["type"], first["object"].metadata.name) == ("ADDED", "after")


# -- the request counter ------------------------------------------------------------------


def test_requests_are_counted_by_verb_and_resource(kube_api_thread: KubeApi) -> None:
    """Authorization, "Determine the request verb"
    (https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb):
    POST is create, GET and HEAD are get (one object), list (a collection) or watch
    (``watch=true``), PUT is update, PATCH is patch, DELETE is delete (one object) or
    deletecollection. A subresource counts apart, as RBAC names it ("pods/status")."""
    api = core(kube_api_thread)
    api.list_namespaced_pod(NS)  # before the reset: not counted
    kube_api_thread.reset_requests()

    api.create_namespaced_pod(NS, pod("a"))
    api.read_namespaced_pod("a", NS)
    current = api.read_namespaced_pod("a", NS)
    api.replace_namespaced_pod("a", NS, current)
    api.patch_namespaced_pod("a", NS, {"metadata": {"labels": {"x": "y"}}})
    api.patch_namespaced_pod_status("a", NS, {"status": {"phase": "Running"}})
    api.list_namespaced_pod(NS)
    api.list_node()
    watch_lines(api, timeout_seconds=1)
    api.delete_namespaced_pod("a", NS)
    api.delete_collection_namespaced_pod(NS)
    api.get_api_resources()  # discovery is no resource request: not counted
    kube_api_thread.create("configmaps", {"metadata": {"name": "test-side"}})  # nor this

    assert kube_api_thread.requests() == {
        ("create", "pods"): 1,
        ("get", "pods"): 2,
        ("update", "pods"): 1,
        ("patch", "pods"): 1,
        ("patch", "pods/status"): 1,
        ("list", "pods"): 1,
        ("list", "nodes"): 1,
        ("watch", "pods"): 1,
        ("delete", "pods"): 1,
        ("deletecollection", "pods"): 1,
    }
    # A copy: the caller's dict does not change with later requests.
    snapshot = kube_api_thread.requests()
    api.list_node()
    assert snapshot[("list", "nodes")] == 1
    assert kube_api_thread.requests()[("list", "nodes")] == 2


def test_a_request_a_test_reaction_answers_is_counted(kube_api_thread: KubeApi) -> None:
    """The counter counts what reached the server, even what a test's reaction answered
    (a failed request is still load on a real API server)."""
    kube_api_thread.emulator["get /api/v1/nodes"] << 503
    kube_api_thread.reset_requests()
    api = core(kube_api_thread)
    try:
        api.list_node(_request_timeout=5)
    except client.exceptions.ApiException as exc:
        assert exc.status == 503
    else:
        raise AssertionError("the reaction did not answer")
    assert kube_api_thread.requests() == {("list", "nodes"): 1}
