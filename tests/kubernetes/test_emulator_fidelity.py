"""The emulator follows the Kubernetes API where a real server is stricter or says more than a
plain object store: each test names the API documentation it follows."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import kmock
import kubernetes.client as client
import kubernetes.watch as watch
import pytest
from kubernetes.client.exceptions import ApiException

from tests.kubernetes import admission
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
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks):
    with ``allowWatchBookmarks=true`` the server may send BOOKMARK events, whose object holds
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
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks):
    the apiserver's watch cache sends a bookmark about every minute on a quiet watch; the
    emulator every ``bookmark_interval`` seconds."""
    kube_api_thread.call(lambda em: setattr(em, "bookmark_interval", 0.2))
    api = core(kube_api_thread)
    rv = api.list_namespaced_pod(NS).metadata.resource_version

    lines = watch_lines(api, resource_version=rv, timeout_seconds=2, allow_watch_bookmarks=True)
    assert {line["type"] for line in lines} == {"BOOKMARK"}
    assert len(lines) >= 3  # periodic ones, then the one at the timeout


def test_a_watch_resumed_from_a_bookmark_misses_nothing(kube_api_thread: KubeApi) -> None:
    """API concepts, "Watch bookmarks"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks):
    a bookmark's resourceVersion is where a client resumes its watch; the official client's
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


# -- custom resources: pruning, defaulting, validation ------------------------------------

WIDGETS = ("example.com", "v1", NS, "widgets")


def widget_crd(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A CRD for ``widgets.example.com/v1`` whose spec (and status) schemas are given."""
    properties: dict[str, Any] = {"spec": spec}
    if status is not None:
        properties["status"] = status
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": properties}},
                    "subresources": {"status": {}} if status is not None else {},
                }
            ],
        },
    }


def widget(name: str, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
        **extra,
    }


def custom(api: KubeApi) -> Any:
    return client.CustomObjectsApi(api.api_client())


def status_of(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body or "{}")
    return body


def training_job(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"command": ["python", "train.py"], "replicas": {"min": 1, "max": 2}, **spec},
    }


TJ = ("resurge.dev", "v1alpha1", NS, "trainingjobs")


def test_unknown_fields_of_a_training_job_are_pruned_in_spec_status_and_metadata(
    kube_api_thread: KubeApi,
) -> None:
    """CustomResourceDefinitions, "Field pruning"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#field-pruning):
    fields the structural schema does not declare are dropped when the object is
    decoded, in spec and, through /status, in status; metadata keeps what ObjectMeta
    has. API concepts, "Field validation"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation):
    by default the server answers with a Warning header per dropped field."""
    api = custom(kube_api_thread)
    body = training_job("j", madeUp={"a": 1})
    body["metadata"]["madeUp"] = "x"
    created, _, headers = api.create_namespaced_custom_object_with_http_info(*TJ, body)
    assert "madeUp" not in created["spec"] and "madeUp" not in created["metadata"]
    assert created["spec"]["command"] == ["python", "train.py"]
    assert 'unknown field \\"spec.madeUp\\"' in headers["Warning"]

    status: Any = api.patch_namespaced_custom_object_status(
        *TJ[:3], TJ[3], "j", {"status": {"phase": "Running", "notInTheSchema": 1}}
    )
    assert status["status"]["phase"] == "Running" and "notInTheSchema" not in status["status"]
    assert kube_api_thread.emulator.pruned_fields == [
        ("trainingjobs", "j", "metadata.madeUp"),
        ("trainingjobs", "j", "spec.madeUp"),
        ("trainingjobs", "j", "status.notInTheSchema"),
    ]


def test_strict_field_validation_refuses_unknown_fields(kube_api_thread: KubeApi) -> None:
    """API concepts, "Field validation"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation):
    with ``fieldValidation=Strict`` (kubectl's default) an unknown field fails the request
    with 400 BadRequest instead of being dropped."""
    api = custom(kube_api_thread)
    with pytest.raises(ApiException) as strict:
        api.create_namespaced_custom_object(
            *TJ, training_job("j", madeUp=1), field_validation="Strict"
        )
    assert strict.value.status == 400
    assert (
        'strict decoding error: unknown field "spec.madeUp"' in status_of(strict.value)["message"]
    )
    assert kube_api_thread.objects("trainingjobs") == []


def test_a_preserve_unknown_fields_subtree_is_kept_and_an_empty_object_schema_prunes_all(
    kube_api_thread: KubeApi,
) -> None:
    """CustomResourceDefinitions, "Controlling pruning"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#controlling-pruning):
    under ``x-kubernetes-preserve-unknown-fields: true`` nothing is pruned; an object
    schema without properties keeps none of its fields."""
    spec = {
        "type": "object",
        "properties": {
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "closed": {"type": "object"},
            "map": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}},
                },
            },
        },
    }
    kube_api_thread.call(lambda em: em.register_crd(widget_crd(spec)))
    created: Any = custom(kube_api_thread).create_namespaced_custom_object(
        *WIDGETS,
        widget(
            "w",
            {
                "free": {"any": {"thing": [1]}},
                "closed": {"gone": 1},
                "map": {"k": {"a": 1, "b": 2}},
            },
        ),
    )
    assert created["spec"] == {
        "free": {"any": {"thing": [1]}},
        "closed": {},
        "map": {"k": {"a": 1}},
    }


def test_defaults_are_applied_on_create_and_on_update_and_nulls_by_nullable(
    kube_api_thread: KubeApi,
) -> None:
    """CustomResourceDefinitions, "Defaulting" and "Defaulting and Nullable"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#defaulting,
    https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#defaulting-and-nullable):
    a ``default`` fills an absent field when a request is decoded, on create and on
    update, inside defaulted objects too; a ``null`` where the schema is not nullable
    is dropped (then defaulted), where it is nullable it stays and takes no default."""
    spec = {
        "type": "object",
        "properties": {
            "size": {"type": "integer", "default": 3},
            "inner": {
                "type": "object",
                "default": {},
                "properties": {"mode": {"type": "string", "default": "fast"}},
            },
            "maybe": {"type": "string", "nullable": True, "default": "d"},
            "notNull": {"type": "string", "default": "n"},
        },
    }
    kube_api_thread.call(lambda em: em.register_crd(widget_crd(spec)))
    api = custom(kube_api_thread)
    created: Any = api.create_namespaced_custom_object(
        *WIDGETS, widget("w", {"maybe": None, "notNull": None})
    )
    assert created["spec"] == {
        "size": 3,
        "inner": {"mode": "fast"},
        "maybe": None,
        "notNull": "n",
    }
    replaced: Any = api.replace_namespaced_custom_object(
        *WIDGETS[:3], WIDGETS[3], "w", {**created, "spec": {"size": 5}}
    )
    assert replaced["spec"] == {"size": 5, "inner": {"mode": "fast"}, "notNull": "n", "maybe": "d"}


def test_a_training_job_the_schema_refuses_is_invalid_naming_the_field(
    kube_api_thread: KubeApi,
) -> None:
    """CustomResourceDefinitions, "Validation"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation):
    a value the
    schema refuses fails the request with 422 Invalid, its message naming the field path,
    and a cause per error."""
    api = custom(kube_api_thread)
    bad = training_job("j")
    bad["spec"]["replicas"]["min"] = 0
    with pytest.raises(ApiException) as invalid:
        api.create_namespaced_custom_object(*TJ, bad)
    assert invalid.value.status == 422
    status = status_of(invalid.value)
    assert status["reason"] == "Invalid"
    assert status["message"] == (
        'TrainingJob.resurge.dev "j" is invalid: spec.replicas.min: Invalid value: 0: '
        "spec.replicas.min in body should be greater than or equal to 1"
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0: spec.replicas.min in body should be greater than "
            "or equal to 1",
            "field": "spec.replicas.min",
        }
    ]
    del bad["spec"]["command"]
    with pytest.raises(ApiException) as missing:
        api.create_namespaced_custom_object(*TJ, bad)
    assert "spec.command: Required value" in status_of(missing.value)["message"]
    assert kube_api_thread.objects("trainingjobs") == []

    # On a merge patch too: the result is what is checked.
    api.create_namespaced_custom_object(*TJ, training_job("ok"))
    with pytest.raises(ApiException) as patched:
        api.patch_namespaced_custom_object_status(
            *TJ[:3], TJ[3], "ok", {"status": {"replicas": {"current": "two"}}}
        )
    assert patched.value.status == 422
    assert 'status.replicas.current: Invalid value: "string"' in status_of(patched.value)["message"]


def test_status_and_the_main_resource_each_ignore_the_other(kube_api_thread: KubeApi) -> None:
    """CustomResourceDefinitions, "Status subresource"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#status-subresource):
    a write to the main resource ignores status, one to /status ignores everything else;
    so an invalid status in a main write is no error, and /status checks status."""
    api = custom(kube_api_thread)
    body = training_job(
        "j",
    )
    body["status"] = {"replicas": {"current": "not a number"}}
    created: Any = api.create_namespaced_custom_object(*TJ, body)
    assert "status" not in created
    status: Any = api.patch_namespaced_custom_object_status(
        *TJ[:3], TJ[3], "j", {"spec": {"priority": 7}, "status": {"phase": "Running"}}
    )
    assert status["spec"].get("priority") == created["spec"].get("priority")
    assert status["status"]["phase"] == "Running"


def test_generation_grows_with_spec_changes_only(kube_api_thread: KubeApi) -> None:
    """CustomResourceDefinitions, "Status subresource"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#status-subresource):
    ``metadata.generation`` is incremented for all changes except to ``.metadata`` or
    ``.status``; a write that the decoding leaves unchanged (an unknown field pruned) is
    no change at all."""
    spec = {"type": "object", "properties": {"size": {"type": "integer"}}}
    kube_api_thread.call(
        lambda em: em.register_crd(
            widget_crd(spec, {"type": "object", "properties": {"n": {"type": "integer"}}})
        )
    )
    api = custom(kube_api_thread)
    created: Any = api.create_namespaced_custom_object(*WIDGETS, widget("w", {"size": 1}))
    assert created["metadata"]["generation"] == 1
    labelled: Any = api.patch_namespaced_custom_object(
        *WIDGETS[:3], WIDGETS[3], "w", {"metadata": {"labels": {"a": "b"}}}
    )
    assert labelled["metadata"]["generation"] == 1
    status: Any = api.patch_namespaced_custom_object_status(
        *WIDGETS[:3], WIDGETS[3], "w", {"status": {"n": 2}}
    )
    assert status["metadata"]["generation"] == 1
    pruned: Any = api.patch_namespaced_custom_object(
        *WIDGETS[:3], WIDGETS[3], "w", {"spec": {"unknown": 1}}
    )
    assert pruned["metadata"]["generation"] == 1
    assert pruned["metadata"]["resourceVersion"] == status["metadata"]["resourceVersion"]
    resized: Any = api.patch_namespaced_custom_object(
        *WIDGETS[:3], WIDGETS[3], "w", {"spec": {"size": 2}}
    )
    assert resized["metadata"]["generation"] == 2


def test_a_strategic_merge_patch_of_a_custom_resource_is_unsupported(
    kube_api_thread: KubeApi,
) -> None:
    """Update API Objects in Place Using kubectl patch, "Notes on the strategic merge
    patch"
    (https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/#notes-on-the-strategic-merge-patch):
    custom resources take JSON and JSON merge patches, not strategic merge: 415."""
    custom(kube_api_thread).create_namespaced_custom_object(*TJ, training_job("j"))
    request = urllib.request.Request(
        f"{kube_api_thread.url}/apis/resurge.dev/v1alpha1/namespaces/{NS}/trainingjobs/j",
        data=json.dumps({"metadata": {"labels": {"a": "b"}}}).encode(),
        headers={"Content-Type": "application/strategic-merge-patch+json"},
        method="PATCH",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 415


# -- the schema's keywords and CEL rules, without a server --------------------------------


@pytest.mark.parametrize(
    ("schema", "value", "error"),
    [
        (
            {"type": "integer"},
            "1",
            'x: Invalid value: "string": x in body must be of type integer: "string"',
        ),
        (
            {"type": "integer"},
            True,
            'x: Invalid value: "boolean": x in body must be of type integer: "boolean"',
        ),
        (
            {"type": "number"},
            None,
            'x: Invalid value: "null": x in body must be of type number: "null"',
        ),
        (
            {"type": "string", "enum": ["a", "b"]},
            "c",
            'x: Unsupported value: "c": supported values: "a", "b"',
        ),
        (
            {"type": "string", "pattern": "^[a-z]+$"},
            "A",
            "x: Invalid value: \"A\": x in body should match '^[a-z]+$'",
        ),
        (
            {"type": "string", "minLength": 2},
            "a",
            'x: Invalid value: "a": x in body should be at least 2 chars long',
        ),
        ({"type": "string", "maxLength": 2}, "abc", "x: Too long: may not be longer than 2"),
        (
            {"type": "integer", "minimum": 1},
            0,
            "x: Invalid value: 0: x in body should be greater than or equal to 1",
        ),
        (
            {"type": "number", "minimum": 0, "exclusiveMinimum": True},
            0,
            "x: Invalid value: 0: x in body should be greater than 0",
        ),
        (
            {"type": "integer", "maximum": 3},
            4,
            "x: Invalid value: 4: x in body should be less than or equal to 3",
        ),
        (
            {"type": "number", "maximum": 3, "exclusiveMaximum": True},
            3,
            "x: Invalid value: 3: x in body should be less than 3",
        ),
        (
            {"type": "array", "minItems": 1, "items": {"type": "string"}},
            [],
            "x: Invalid value: 0: x in body should have at least 1 items",
        ),
        (
            {"type": "array", "maxItems": 1, "items": {"type": "string"}},
            ["a", "b"],
            "x: Too many: 2: must have at most 1 items",
        ),
        (
            {"type": "array", "items": {"type": "string"}},
            ["a", 1],
            'x[1]: Invalid value: "integer": x[1] in body must be of type string: "integer"',
        ),
        (
            {"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}},
            {},
            "x.a: Required value",
        ),
        (
            {"type": "object", "additionalProperties": {"type": "integer"}},
            {"k": "v"},
            'x[k]: Invalid value: "string": x[k] in body must be of type integer: "string"',
        ),
        (
            {"type": "string", "format": "date-time"},
            "yesterday",
            'x: Invalid value: "yesterday": x in body must be of type date-time: "yesterday"',
        ),
        (
            {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            ["a", "a"],
            'x[1]: Duplicate value: "a"',
        ),
        (
            {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
            [{"name": "a"}, {"name": "a"}],
            'x[1]: Duplicate value: {"name":"a"}',
        ),
    ],
)
def test_each_schema_keyword_is_checked_and_worded_as_the_apiserver_does(
    schema: dict[str, Any], value: Any, error: str
) -> None:
    """CustomResourceDefinitions, "Validation"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation):
    the OpenAPI v3 keywords a structural schema may use; each error names its field path
    as the apiserver's messages do."""
    root = {"type": "object", "properties": {"x": schema}}
    assert admission.validate(root, {"x": value}, None) == [error]
    assert admission.validate(root, {"x": value}, {"x": value}) == []  # ratcheted


def test_valid_values_pass_every_keyword() -> None:
    """CustomResourceDefinitions, "Validation"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation):
    the checks refuse only what they should: integral numbers are integers, an absent
    optional field and a nullable null pass."""
    schema = {
        "type": "object",
        "required": ["n"],
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 3},
            "f": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
            "t": {"type": "string", "format": "date-time"},
            "maybe": {"type": "string", "nullable": True},
            "s": {"type": "string", "pattern": "^a", "minLength": 1, "maxLength": 3},
        },
    }
    value = {"n": 3, "f": 0.5, "t": "2026-01-02T03:04:05Z", "maybe": None, "s": "ab"}
    assert admission.validate(schema, value) == []
    assert admission.validate(schema, {"n": 2.0}) == []


def test_validation_ratcheting_lets_unchanged_invalid_values_stay() -> None:
    """CustomResourceDefinitions, "Validation ratcheting"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-ratcheting):
    on an update, a value equal to the stored one is not checked again (a stricter schema
    does not block writes to other fields); a changed one is."""
    schema = {
        "type": "object",
        "properties": {
            "old": {"type": "integer", "minimum": 10},
            "new": {"type": "integer", "minimum": 10},
        },
    }
    stored = {"old": 1, "new": 10}
    assert admission.validate(schema, {"old": 1, "new": 11}, stored) == []
    assert admission.validate(schema, {"old": 2, "new": 11}, stored) == [
        "old: Invalid value: 2: old in body should be greater than or equal to 10"
    ]


def test_prune_and_validate_as_plain_functions() -> None:
    """CustomResourceDefinitions, "Field pruning"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#field-pruning):
    ``prune`` gives the pruned copy and the paths dropped (list items and map values by
    index and key), leaving its argument alone; ``root=False`` prunes a part."""
    schema = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"a": {"type": "integer"}}},
            },
            "map": {
                "type": "object",
                "additionalProperties": {"type": "object", "properties": {}},
            },
        },
    }
    obj = {"items": [{"a": 1, "b": 2}], "map": {"k": {"c": 3}}, "top": 4}
    pruned, removed = admission.prune(schema, obj, root=False)
    assert pruned == {"items": [{"a": 1}], "map": {"k": {}}}
    assert removed == ["items[0].b", "map[k].c", "top"]
    assert obj["top"] == 4
    whole, dropped = admission.prune(
        {"type": "object", "properties": {}},
        {"apiVersion": "v", "kind": "K", "metadata": {"name": "n", "odd": 1}},
    )
    assert whole == {"apiVersion": "v", "kind": "K", "metadata": {"name": "n"}}
    assert dropped == ["metadata.odd"]


def test_cel_rules_are_evaluated_with_self_and_transition_rules_with_old_self(
    kube_api_thread: KubeApi,
) -> None:
    """CustomResourceDefinitions, "Validation rules" and "Transition rules"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-rules,
    https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#transition-rules):
    ``x-kubernetes-validations`` rules see the value as ``self``; a rule using ``oldSelf``
    is a transition rule, not evaluated on create, evaluated against the stored value on
    update. A failed rule is 422 Invalid with its message; ``reason`` and ``fieldPath``
    pick the error's type and field."""
    spec = {
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": "self.low <= self.high", "message": "low must not exceed high"},
            {
                "rule": "self.name == oldSelf.name",
                "message": "name is immutable",
                "reason": "FieldValueForbidden",
                "fieldPath": ".name",
            },
        ],
        "properties": {
            "name": {"type": "string"},
            "low": {"type": "integer"},
            "high": {"type": "integer"},
            "ratio": {"type": "number", "x-kubernetes-validations": [{"rule": "self < 1.0"}]},
        },
    }
    kube_api_thread.call(lambda em: em.register_crd(widget_crd(spec)))
    api = custom(kube_api_thread)
    with pytest.raises(ApiException) as crossed:
        api.create_namespaced_custom_object(
            *WIDGETS, widget("w", {"name": "a", "low": 3, "high": 2})
        )
    assert status_of(crossed.value)["message"] == (
        'Widget.example.com "w" is invalid: spec: Invalid value: "object": low must not exceed high'
    )
    # The transition rule is not evaluated on create.
    api.create_namespaced_custom_object(
        *WIDGETS, widget("w", {"name": "a", "low": 1, "high": 2, "ratio": 0.5})
    )

    def patch(spec: dict[str, Any]) -> str:
        with pytest.raises(ApiException) as refused:
            api.patch_namespaced_custom_object(*WIDGETS[:3], WIDGETS[3], "w", {"spec": spec})
        assert refused.value.status == 422
        return str(status_of(refused.value)["message"])

    assert (
        patch({"name": "b"})
        == 'Widget.example.com "w" is invalid: spec.name: Forbidden: name is immutable'
    )
    # A number field is a double in CEL even when written as an integer: 1 < 1.0 is false.
    assert patch({"ratio": 1}) == (
        'Widget.example.com "w" is invalid: spec.ratio: Invalid value: "number": '
        "failed rule: self < 1.0"
    )
    # A wrong type stops the rules from running, as on the apiserver.
    assert patch({"high": "x", "low": 5}) == (
        'Widget.example.com "w" is invalid: [spec.high: Invalid value: "string": spec.high in '
        'body must be of type integer: "string", <nil>: Invalid value: "null": some '
        "validation rules were not checked because the object was invalid; correct the "
        "existing errors to complete validation]"
    )
    updated: Any = api.patch_namespaced_custom_object(
        *WIDGETS[:3], WIDGETS[3], "w", {"spec": {"low": 2, "high": 9}}
    )
    assert updated["spec"]["high"] == 9


# -- resourceVersion preconditions --------------------------------------------------------


def test_a_patch_carrying_a_stale_resource_version_conflicts(kube_api_thread: KubeApi) -> None:
    """API concepts, "Resource versions"
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions) and
    the API conventions' "Concurrency Control and Consistency"
    (https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#concurrency-control-and-consistency):
    a write whose body carries ``metadata.resourceVersion`` is refused with 409 Conflict
    unless it is the stored one: a PUT, and a merge patch of the object or its status; a
    patch without one applies to whatever is stored."""
    api = custom(kube_api_thread)
    created: Any = api.create_namespaced_custom_object(*TJ, training_job("j"))
    stale = created["metadata"]["resourceVersion"]
    api.patch_namespaced_custom_object(*TJ[:3], TJ[3], "j", {"metadata": {"labels": {"a": "1"}}})
    writes: list[Callable[[], Any]] = [
        lambda: api.patch_namespaced_custom_object(
            *TJ[:3], TJ[3], "j", {"metadata": {"resourceVersion": stale, "labels": {"a": "2"}}}
        ),
        lambda: api.patch_namespaced_custom_object_status(
            *TJ[:3],
            TJ[3],
            "j",
            {"metadata": {"resourceVersion": stale}, "status": {"phase": "Failed"}},
        ),
        lambda: api.replace_namespaced_custom_object(*TJ[:3], TJ[3], "j", created),
    ]
    for write in writes:
        with pytest.raises(ApiException) as conflict:
            write()
        assert conflict.value.status == 409 and status_of(conflict.value)["reason"] == "Conflict"
    stored = kube_api_thread.get("tj", "j")
    assert stored["metadata"]["labels"] == {"a": "1"} and "status" not in stored
    current = stored["metadata"]["resourceVersion"]
    fresh: Any = api.patch_namespaced_custom_object_status(
        *TJ[:3],
        TJ[3],
        "j",
        {"metadata": {"resourceVersion": current}, "status": {"phase": "Failed"}},
    )
    assert fresh["status"]["phase"] == "Failed"


# -- names, labels, annotations -----------------------------------------------------------


def invalid(call: Any) -> str:
    """The message of the 422 Invalid that ``call()`` gets."""
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 422, refused.value.body
    assert status_of(refused.value)["reason"] == "Invalid"
    return str(status_of(refused.value)["message"])


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"clusterIP": "None", "selector": {"a": "b"}},
    }


def test_names_are_validated_by_kind(kube_api_thread: KubeApi) -> None:
    """Object Names and IDs
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/): most
    kinds' names are DNS-1123 subdomains (at most 253 characters, lower-case
    alphanumerics, '-' and '.', alphanumeric at both ends); a Service's is an RFC 1035
    label (at most 63, starting with a letter, no '.'). So ``llama-3.1-8b`` names a pod
    or a TrainingJob but not a Service, and ``70b-pretrain`` no Service either."""
    api = core(kube_api_thread)
    jobs = custom(kube_api_thread)
    api.create_namespaced_pod(NS, pod("llama-3.1-8b"))
    jobs.create_namespaced_custom_object(*TJ, training_job("70b-pretrain"))
    kube_api_thread.create("configmaps", {"metadata": {"name": "a." + "b" * 251}})

    assert invalid(lambda: api.create_namespaced_service(NS, service("llama-3.1-8b"))) == (
        'Service "llama-3.1-8b" is invalid: metadata.name: Invalid value: "llama-3.1-8b": a '
        "DNS-1035 label must consist of lower case alphanumeric characters or '-', start with "
        "an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
        "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
    )
    assert 'metadata.name: Invalid value: "70b-pretrain": a DNS-1035 label' in invalid(
        lambda: api.create_namespaced_service(NS, service("70b-pretrain"))
    )
    assert "must be no more than 63 characters" in invalid(
        lambda: api.create_namespaced_service(NS, service("s" * 64))
    )
    assert (
        'Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": '
        "a lowercase RFC 1123 subdomain"
        in invalid(lambda: api.create_namespaced_pod(NS, pod("Bad_Name")))
    )
    assert "metadata.name: Invalid value" in invalid(
        lambda: jobs.create_namespaced_custom_object(*TJ, training_job("Upper"))
    )
    assert "must be no more than 253 characters" in invalid_here(
        lambda: kube_api_thread.create("configmaps", {"metadata": {"name": "a" * 254}})
    )
    lease = {"metadata": {"name": "-lease"}, "spec": {}}
    assert invalid_here(lambda: kube_api_thread.create("leases", lease)).startswith(
        'Lease.coordination.k8s.io "-lease" is invalid: metadata.name'
    )
    assert "metadata.name: Required value: name or generateName is required" in invalid(
        lambda: api.create_namespaced_config_map(NS, {"metadata": {}})
    )
    assert {p["metadata"]["name"] for p in kube_api_thread.objects("pods")} == {"llama-3.1-8b"}
    assert kube_api_thread.objects("services") == []


def invalid_here(call: Any) -> str:
    """The message of the 422 Invalid a test-side call gets."""
    with pytest.raises(kmock.KubernetesError) as refused:
        call()
    assert refused.value.status == 422
    return str(refused.value.message)


def test_generate_name_is_a_prefix_checked_by_the_kinds_rule(kube_api_thread: KubeApi) -> None:
    """Object Names and IDs
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/) and API
    conventions, "Idempotency" (generateName): the prefix is checked as the kind's names
    are, a trailing '-' allowed; it is cut to 58 characters and 5 random ones follow."""
    api = core(kube_api_thread)
    made = api.create_namespaced_pod(NS, {**pod(""), "metadata": {"generateName": "w" * 70 + "-"}})
    assert len(made.metadata.name) == 63 and made.metadata.name.startswith("w" * 58)
    assert 'metadata.generateName: Invalid value: "Bad-"' in invalid(
        lambda: api.create_namespaced_pod(NS, {**pod(""), "metadata": {"generateName": "Bad-"}})
    )
    assert 'metadata.generateName: Invalid value: "job."' in invalid(
        lambda: api.create_namespaced_service(
            NS, {**service(""), "metadata": {"generateName": "job."}}
        )
    )


def test_a_pods_hostname_and_subdomain_are_rfc_1123_labels(kube_api_thread: KubeApi) -> None:
    """DNS for Services and Pods, "Pod's hostname and subdomain fields"
    (https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/#pod-s-hostname-and-subdomain-fields):
    ``spec.hostname`` and ``spec.subdomain`` are each an RFC 1123 label (at most 63,
    lower-case alphanumerics and '-', no '.')."""
    api = core(kube_api_thread)
    named = pod("a")
    named["spec"].update(hostname="worker-0", subdomain="job-1")
    api.create_namespaced_pod(NS, named)
    dotted = pod("b")
    dotted["spec"].update(hostname="llama-3.1-8b-0", subdomain="Job_1")
    message = invalid(lambda: api.create_namespaced_pod(NS, dotted))
    assert message.startswith(
        'Pod "b" is invalid: [spec.hostname: Invalid value: "llama-3.1-8b-0": '
        "a lowercase RFC 1123 label"
    )
    assert 'spec.subdomain: Invalid value: "Job_1": a lowercase RFC 1123 label' in message
    assert "must be no more than 63 characters" in invalid(
        lambda: api.patch_namespaced_pod("a", NS, {"spec": {"hostname": "h" * 64}})
    )


def test_labels_and_annotations_are_validated(kube_api_thread: KubeApi) -> None:
    """Labels and Selectors, "Syntax and character set"
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set)
    and Annotations, "Syntax and character set"
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/annotations/#syntax-and-character-set):
    a key is an optional DNS subdomain prefix and '/' and a name of at most 63
    alphanumerics, '-', '_' and '.'; a label value at most 63 of them (or empty); all
    annotations together at most 256 KiB. On create and on update."""
    api = core(kube_api_thread)
    ok = pod("a")
    ok["metadata"]["labels"] = {"resurge.dev/job": "llama-3.1-8b", "empty": "", "A_b": "C.d"}
    api.create_namespaced_pod(NS, ok)

    def labelled(labels: dict[str, str]) -> Any:
        return lambda: api.patch_namespaced_pod("a", NS, {"metadata": {"labels": labels}})

    assert invalid(labelled({"job": "v" * 64})).startswith(
        'Pod "a" is invalid: metadata.labels: Invalid value: "'
        + "v" * 64
        + '": must be no more than 63 characters'
    )
    assert "a valid label must be an empty string or consist of alphanumeric characters" in invalid(
        labelled({"job": "-bad"})
    )
    assert "name part must consist of alphanumeric characters" in invalid(
        labelled({"bad key": "v"})
    )
    assert "prefix part a lowercase RFC 1123 subdomain" in invalid(labelled({"Bad.Prefix/k": "v"}))
    big = {"note": "x" * (256 * 1024)}
    assert "metadata.annotations: Too long: must have at most 262144 bytes" in invalid(
        lambda: api.patch_namespaced_pod("a", NS, {"metadata": {"annotations": big}})
    )
    assert "metadata.labels" in invalid_here(
        lambda: kube_api_thread.create(
            "configmaps", {"metadata": {"name": "c", "labels": {"k": "-"}}}
        )
    )
    assert kube_api_thread.get("pods", "a")["metadata"]["labels"] == ok["metadata"]["labels"]


def test_a_pods_containers_are_named_and_have_an_image(kube_api_thread: KubeApi) -> None:
    """Pod API reference, "Container" and "ContainerPort"
    (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#Container):
    a pod has at least one container; each container's ``name`` is a DNS label (RFC 1123)
    unique in the pod, and its ``image`` is required (no default); a port's ``name`` is an
    IANA service name (at most 15 characters, at least one letter)."""
    api = core(kube_api_thread)

    def with_containers(name: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
        return {**pod(name), "spec": {"containers": containers}}

    assert invalid(lambda: api.create_namespaced_pod(NS, with_containers("a", []))) == (
        'Pod "a" is invalid: spec.containers: Required value'
    )
    two = [{"name": "worker", "image": "i"}, {"name": "worker"}]
    assert invalid(lambda: api.create_namespaced_pod(NS, with_containers("a", two))) == (
        'Pod "a" is invalid: [spec.containers[1].name: Duplicate value: "worker", '
        "spec.containers[1].image: Required value]"
    )
    named = [
        {
            "name": "Worker_1",
            "image": "i",
            "ports": [{"containerPort": 1, "name": "rendezvous-ports"}],
        }
    ]
    message = invalid(lambda: api.create_namespaced_pod(NS, with_containers("a", named)))
    assert (
        'spec.containers[0].name: Invalid value: "Worker_1": a lowercase RFC 1123 label' in message
    )
    assert (
        'spec.containers[0].ports[0].name: Invalid value: "rendezvous-ports": must be no more '
        "than 15 characters" in message
    )
    ported = [{"name": "w", "image": "i", "ports": [{"containerPort": 29500, "name": "c10d"}]}]
    api.create_namespaced_pod(NS, with_containers("ok", ported))


def test_finalizers_are_qualified_names_and_none_is_added_while_deleting(
    kube_api_thread: KubeApi,
) -> None:
    """Finalizers
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/) and
    Object Names and IDs: a finalizer is a qualified name; one without a domain prefix
    that is not a standard finalizer is refused on a built-in kind and warned of on a
    custom resource; while an object is being deleted no finalizer can be added (only
    removed)."""
    api = core(kube_api_thread)
    jobs = custom(kube_api_thread)
    held = pod("a")
    held["metadata"]["finalizers"] = ["resurge.dev/cleanup"]
    api.create_namespaced_pod(NS, held)
    assert "name is neither a standard finalizer name nor is it fully qualified" in invalid(
        lambda: api.patch_namespaced_pod("a", NS, {"metadata": {"finalizers": ["cleanup"]}})
    )
    job = training_job("j")
    job["metadata"]["finalizers"] = ["cleanup"]
    _, _, headers = jobs.create_namespaced_custom_object_with_http_info(*TJ, job)
    assert "prefer a domain-qualified finalizer name" in headers["Warning"]

    api.delete_namespaced_pod("a", NS)
    more = {"metadata": {"finalizers": ["resurge.dev/cleanup", "example.com/more"]}}
    assert invalid(lambda: api.patch_namespaced_pod("a", NS, more)) == (
        'Pod "a" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added '
        'if the object is being deleted, found new finalizers []string{"example.com/more"}'
    )
    api.patch_namespaced_pod("a", NS, {"metadata": {"finalizers": None}})
    assert kube_api_thread.objects("pods") == []


def test_rules_ratchet_unless_they_use_old_self_and_see_only_a_roots_name() -> None:
    """CustomResourceDefinitions, "Validation ratcheting" and "Validation rules"
    (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-ratcheting):
    a rule on an unchanged value is not evaluated again, except a transition rule
    (``oldSelf``), which is never ratcheted; at the root a rule sees only ``name`` and
    ``generateName`` of ``metadata``."""
    schema = {
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": "!has(self.metadata.labels)", "message": "labels are hidden from rules"}
        ],
        "properties": {
            "metadata": {"type": "object"},
            "floor": {"type": "integer", "x-kubernetes-validations": [{"rule": "self > 5"}]},
            "counter": {
                "type": "integer",
                "x-kubernetes-validations": [{"rule": "self > oldSelf"}],
            },
        },
    }
    stored = {"metadata": {"name": "a", "labels": {"x": "y"}}, "floor": 1, "counter": 1}
    assert admission.validate(schema, stored) == [
        'floor: Invalid value: "integer": failed rule: self > 5'
    ]
    assert admission.validate(schema, stored, stored) == [
        'counter: Invalid value: "integer": failed rule: self > oldSelf'
    ]
    assert admission.validate(schema, {**stored, "counter": 2}, stored) == []
