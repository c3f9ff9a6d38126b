"""A Kubernetes API server for tests: kmock's KubernetesEmulator, made to behave like a real one.

kmock's emulator is an in-memory object store behind Kubernetes-shaped URLs. What a real API
server does and the emulator lacks, ``ClusterEmulator`` supplies (each marked "the emulator
lacks this; the fixture supplies it" where it is done):

- ``metadata.uid``, ``creationTimestamp``, ``generation``; one cluster-wide, increasing
  ``resourceVersion`` stamped on every write and returned by lists (kmock: ``'...'``);
- watches that start after ``resourceVersion=N`` (kmock replays every object as ADDED and
  ignores it), a retained event log per resource, ``compact()`` and the 410 Expired ERROR
  event a real server sends for a version older than the compaction;
- ``timeoutSeconds`` on watches, and ``break_watches()`` to end every open watch stream;
- BOOKMARK events on watches with ``allowWatchBookmarks=true``: every
  ``bookmark_interval`` seconds (1 s; a real server: about a minute) and when the watch
  ends by its timeout;
- ``requests``: every API request served, counted by (verb, resource) as the audit log
  names them (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
  ``deletecollection``; a subresource as ``"pods/status"``), and ``reset_requests()``;
- ``labelSelector`` and ``fieldSelector`` on lists and watches (``selectors.py``);
- PUT (replace) with the ``resourceVersion`` precondition (409 Conflict), the status and
  scale subresources, merge, strategic merge and JSON patches (``patches.py``; kmock merges
  dicts, replaces lists and cannot apply a JSON patch), finalizers and
  ``deletionTimestamp``, delete preconditions and collection deletes;
- garbage collection by ``metadata.ownerReferences``, as the controller-manager does (at
  once, right after the owner's DELETED event, instead of eventually);
- registered resources, so discovery (with the official client's trailing slashes),
  ``CoreV1Api``, ``CoordinationV1Api``, ``CustomObjectsApi`` and the dynamic client work:
  v1 nodes, pods, services, events, configmaps, secrets; coordination.k8s.io/v1 leases;
  policy/v1 poddisruptionbudgets; and custom
  resources from their CRDs (``register_crd``: the fixture registers the TrainingJob CRD
  the product generates, ``resurge.jobspec.crd.training_job_crd()``);
- custom resources decoded and checked by their CRD's structural schema (admission.py):
  unknown fields pruned (kept in ``pruned_fields``, answered as Warning headers, refused
  with 400 under ``fieldValidation=Strict``), defaults applied, then the schema's checks
  and its CEL rules (``x-kubernetes-validations``, transition rules with ``oldSelf`` on
  updates only), with validation ratcheting; 422 Invalid worded as the apiserver words it;
  /status checks status and the main resource the rest; ``metadata.generation`` grows
  with changes outside metadata and status;
- the ``pods/eviction`` subresource (``POST`` a policy/v1 Eviction): the pod deleted, or
  429 TooManyRequests where its PodDisruptionBudget allows no disruption, as the
  apiserver decides (disruption.py, which also checks a budget's spec and says what it
  simplifies: no disruption controller writes a budget's status);
- names checked by kind (DNS-1123 subdomain; a Service's an RFC 1035 label), ``generateName``
  too, labels, annotations and finalizers (none added while deleting); unknown
  ``metadata`` fields pruned for every kind; of a pod's spec: ``hostname`` and
  ``subdomain`` (RFC 1123 labels), its containers (at least one, unique RFC 1123 label
  names, an image) and their port names (IANA service names).

Everything runs on the event loop the emulator serves on: the HTTP handlers and the
test-side methods (``create_object``, ``replace_object``, ``patch_object``,
``delete_object``, ``get_object``, ``current``, ``compact``, ``break_watches``) change the
store without awaiting, so each change and its watch event are atomic. Call them on that
loop only; ``conftest.KubeApi`` does that from any thread. kmock's DSL still works on top:
a reaction a test adds wins over the emulator, e.g. ``emulator["get /api/v1/nodes"] << 503``
fails every node list from then on.

Not done as on a real server (no test here needs it): built-in kinds are not checked or
pruned beyond the list above (a Service's ports, a pod's resources or volumes: anything
goes; a pod's spec is not immutable, so the process kubelet binds a pod by patching its
``spec.nodeName`` instead of through ``pods/binding``); no admission webhooks, Pod
Security or quotas; the CEL limits of admission.py's doc; one version per CRD, no
conversion; no server-side apply (415); no scheduler, kubelet or node controller (pods stay
where they were put, unscheduled pods stay Pending, and a pod is deleted at once instead of
gracefully); no ``dryRun``; ``limit``/``continue`` are ignored (a list is always whole,
which a real server may also do); namespaces are not objects (any namespace exists); no
authentication or authorization; a Secret's ``stringData`` is not merged into ``data``
(resurge writes ``data``).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import json
import math
import random
import re
import string
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal.rendering import Response as KResponse

from tests.kubernetes import admission
from tests.kubernetes.disruption import budget_errors, eviction_refusal
from tests.kubernetes.patches import PatchError, json_patch, merge_patch, strategic_merge_patch
from tests.kubernetes.selectors import SelectorError, field_selector, label_selector

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class Kind:
    """One resource the emulator serves, with what a real server knows about it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str
    shortnames: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    # Built-in kinds take strategic merge patches; custom resources answer 415 to them.
    builtin: bool = True
    # A delete answers with the deleted object (else with a Status).
    delete_returns_object: bool = False
    # What a create keeps of .status: None drops it; a dict replaces it.
    status_on_create: Mapping[str, Any] | None = None
    keep_status_on_create: bool = False
    # The scale subresource's paths (dotted, without the leading dot).
    spec_replicas_path: str = ""
    status_replicas_path: str = ""
    label_selector_path: str = ""
    # How metadata.name is checked (admission.NAME_RULES): most kinds take a DNS-1123
    # subdomain, a Service an RFC 1035 label.
    name_rule: str = "subdomain"
    # A custom resource's structural schema (its CRD version's openAPIV3Schema).
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> kmock.resource:
        return kmock.resource(self.group, self.version, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def qualified(self) -> str:
        """The kind as the apiserver's messages name it: ``Pod``, ``Lease.coordination.k8s.io``."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def names(self) -> set[str]:
        """Every name ``ClusterEmulator.kind`` finds this kind by (lower-case)."""
        return {self.plural, self.singular, self.kind.lower(), *self.shortnames}


BUILTIN_KINDS: tuple[Kind, ...] = (
    Kind(
        "",
        "v1",
        "nodes",
        "Node",
        namespaced=False,
        singular="node",
        shortnames=("no",),
        subresources=("status",),
        keep_status_on_create=True,
    ),
    Kind(
        "",
        "v1",
        "pods",
        "Pod",
        namespaced=True,
        singular="pod",
        shortnames=("po",),
        subresources=("status", "eviction"),
        delete_returns_object=True,
        status_on_create={"phase": "Pending"},
    ),
    Kind(
        "",
        "v1",
        "services",
        "Service",
        namespaced=True,
        singular="service",
        shortnames=("svc",),
        name_rule="rfc1035-label",
        subresources=("status",),
        delete_returns_object=True,
        status_on_create={"loadBalancer": {}},
    ),
    Kind("", "v1", "events", "Event", namespaced=True, singular="event", shortnames=("ev",)),
    Kind(
        "",
        "v1",
        "configmaps",
        "ConfigMap",
        namespaced=True,
        singular="configmap",
        shortnames=("cm",),
    ),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True, singular="lease"),
    Kind("", "v1", "secrets", "Secret", namespaced=True, singular="secret"),
    Kind(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        namespaced=True,
        singular="poddisruptionbudget",
        shortnames=("pdb",),
        subresources=("status",),
    ),
)


def kind_from_crd(crd: Mapping[str, Any]) -> Kind:
    """The Kind a CustomResourceDefinition (apiextensions.k8s.io/v1) declares: its storage
    version, names, scope, subresources and schema."""
    spec = crd["spec"]
    names = spec["names"]
    version = next(v for v in spec["versions"] if v.get("storage"))
    subresources = version.get("subresources") or {}
    scale = subresources.get("scale") or {}
    return Kind(
        spec["group"],
        version["name"],
        names["plural"],
        names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        singular=names.get("singular") or names["kind"].lower(),
        shortnames=tuple(names.get("shortNames") or ()),
        subresources=tuple(name for name in ("status", "scale") if name in subresources),
        builtin=False,
        delete_returns_object=True,
        spec_replicas_path=scale.get("specReplicasPath", "").lstrip("."),
        status_replicas_path=scale.get("statusReplicasPath", "").lstrip("."),
        label_selector_path=(scale.get("labelSelectorPath") or "").lstrip("."),
        schema=(version.get("schema") or {}).get("openAPIV3Schema"),
    )


@dataclass(frozen=True)
class WatchEvent:
    """One change in a resource's event log: the object after it, and before it."""

    rv: int
    type: str
    object: dict[str, Any]
    old: dict[str, Any] | None


@dataclass(eq=False)
class _Watcher:
    key: tuple[str, str, str]
    queue: asyncio.Queue[WatchEvent | None] = field(default_factory=asyncio.Queue)


def error(code: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """A failure as a real server reports it: HTTP ``code`` and a Status body."""
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _get_path(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        if not isinstance(obj.get(part), dict):
            obj[part] = {}
        obj = obj[part]
    obj[parts[-1]] = value


# The kind (and its group and version) a subresource of another kind than its own takes.
_SUBRESOURCE_KINDS = {
    "scale": {"kind": "Scale", "group": "autoscaling", "version": "v1"},
    "eviction": {"kind": "Eviction", "group": "policy", "version": "v1"},
}


def _without_meta_and_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator with a real API server's semantics (see the module doc).

    Stored objects stay in kmock's ``objects`` (``emulator.objects['v1/pods', 'default',
    'p']``), one history entry per write; ``current()`` lists the live ones.
    """

    _rv: int = attrs.field(default=0, init=False)
    _kinds: dict[tuple[str, str, str], Kind] = attrs.field(factory=dict, init=False)
    _log: dict[tuple[str, str, str], list[WatchEvent]] = attrs.field(factory=dict, init=False)
    _compacted: dict[tuple[str, str, str], int] = attrs.field(factory=dict, init=False)
    _watchers: set[_Watcher] = attrs.field(factory=set, init=False)
    _watchers_changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    # Seconds between BOOKMARK events on a watch that asked for them (a real server sends
    # one about every minute; tests want them sooner).
    bookmark_interval: float = 1.0
    # Every API request served over HTTP, by (verb, resource) as the apiserver's audit log
    # names them; a subresource counts as "plural/subresource" (e.g. "pods/status").
    requests: collections.Counter[tuple[str, str]] = attrs.field(
        factory=collections.Counter, init=False
    )
    # Every field a write's decoding pruned: (plural, name, path), e.g.
    # ("trainingjobs", "j", "status.submittedSpec"). A real server only warns of them.
    pruned_fields: list[tuple[str, str, str]] = attrs.field(factory=list, init=False)
    # The warnings of the request being served (sent as Warning headers).
    warnings: list[str] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # One handler for every request on a resource (a URL with a plural), above kmock's
        # own fallbacks and below anything a test adds (e.g. `emulator['get /api/v1/pods']
        # << 500` to fail a call).
        (self.fallback**1)[self._is_resource_request] << self._serve_resource
        # The official client asks for discovery with a trailing slash (/version/, /api/v1/,
        # /apis/group/version/), which kmock's discovery does not serve.
        discovery = self.fallback**1  # above kmock's list fallback, which takes these too
        discovery["get /version/"] << self._serve_server_version
        discovery["get /api/"] << self._serve_api
        discovery["get /apis/"] << self._serve_apis
        discovery["get", re.compile(r"/api/[^/]+/")] << self._serve_version
        discovery["get", re.compile(r"/apis/[^/]+/")] << self._serve_group
        discovery["get", re.compile(r"/apis/[^/]+/[^/]+/")] << self._serve_version
        for kind in BUILTIN_KINDS:
            self.register(kind)

    # -- registration -----------------------------------------------------------------------

    def register(self, kind: Kind) -> None:
        """Serve ``kind``: its URLs, its discovery entry, its event log.

        The emulator lacks this (it serves only resources it was told about, with guessed
        kinds); the fixture supplies it.
        """
        self._kinds[kind.key] = kind
        self._log.setdefault(kind.key, [])
        self._compacted.setdefault(kind.key, 0)
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]
        self.resources[kind.resource] = kmock.ResourceInfo(
            namespaced=kind.namespaced,
            kind=kind.kind,
            singular=kind.singular,
            verbs=[*verbs, "watch"],
            shortnames=kind.shortnames,
            subresources=kind.subresources,
        )

    def register_crd(self, crd: Mapping[str, Any]) -> Kind:
        """Serve the custom resource a CRD declares, checked by its schema (module doc)."""
        kind = kind_from_crd(crd)
        self.register(kind)
        return kind

    def kind(self, name: str) -> Kind:
        """The registered kind by plural, singular, kind or short name (any case)."""
        for kind in self._kinds.values():
            if name.lower() in kind.names():
                return kind
        raise KeyError(f"no such resource: {name!r}")

    @property
    def resource_version(self) -> int:
        """The cluster's current resourceVersion (of the latest write)."""
        return self._rv

    # -- the store, for the test side and the HTTP handlers ---------------------------------

    def _items(self, kind: Kind) -> Iterator[tuple[str | None, str, dict[str, Any]]]:
        for (resource, namespace, name), obj in list(self.objects.items()):
            if resource == kind.resource and not obj.deleted:
                yield namespace, name, obj.raw

    def _stored(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (kind.resource, (namespace or "default") if kind.namespaced else None, name)
        if key not in self.objects:
            return None
        obj = self.objects[key]
        return None if obj.deleted else copy.deepcopy(obj.raw)

    def current(self, kind: str | Kind, namespace: str | None = None) -> list[dict[str, Any]]:
        """Deep copies of the live objects of ``kind`` (in ``namespace`` if given), sorted."""
        kind = kind if isinstance(kind, Kind) else self.kind(kind)
        items = [
            (ns or "", name, obj)
            for ns, name, obj in self._items(kind)
            if namespace is None or ns == namespace
        ]
        return [copy.deepcopy(obj) for _, _, obj in sorted(items, key=lambda i: i[:2])]

    def get_object(
        self, kind: str | Kind, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """A deep copy of one live object; a 404 ``KubernetesError`` if there is none.

        For a namespaced kind, no ``namespace`` means "default" here and in the other
        ``*_object`` methods (in ``current`` it means every namespace).
        """
        kind = kind if isinstance(kind, Kind) else self.kind(kind)
        obj = self._stored(kind, namespace, name)
        if obj is None:
            raise self._not_found(kind, name)
        return obj

    def _not_found(self, kind: Kind, name: str) -> kmock.KubernetesError:
        what = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
        return error(
            404,
            "NotFound",
            f'{what} "{name}" not found',
            name=name,
            group=kind.group,
            kind=kind.plural,
        )

    def _emit(
        self, kind: Kind, type_: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        event = WatchEvent(self._rv, type_, copy.deepcopy(obj), copy.deepcopy(old))
        self._log[kind.key].append(event)
        for watcher in self._watchers:
            if watcher.key == kind.key:
                watcher.queue.put_nowait(event)

    def _write(self, kind: Kind, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (kind.resource, meta.get("namespace"), meta["name"])
        if key in self.objects:
            stored = self.objects[key]
            if stored.deleted:
                stored.create(copy.deepcopy(obj))
            else:
                stored.history.append(copy.deepcopy(obj))
        else:
            self.objects[key] = copy.deepcopy(obj)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def create_object(
        self,
        kind: str | Kind,
        body: Mapping[str, Any],
        namespace: str | None = None,
        field_validation: str = "Warn",
    ) -> dict[str, Any]:
        """Create an object as a POST does; returns it as stored.

        The emulator lacks uid, creationTimestamp, resourceVersion, generation, generateName
        and the status reset of a create; the fixture supplies them.
        """
        kind = kind if isinstance(kind, Kind) else self.kind(kind)
        if not isinstance(body.get("metadata", {}), dict):
            raise error(400, "BadRequest", "metadata must be an object")
        obj = self._decode(kind, body, field_validation)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            body_ns = meta.get("namespace")
            namespace = namespace or body_ns or "default"
            if body_ns and body_ns != namespace:
                raise error(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
            namespace = None
        if not meta.get("name") and meta.get("generateName"):
            # As the apiserver: the prefix cut to 58 characters, then 5 random ones.
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = str(meta["generateName"])[:58] + suffix
        name = str(meta.get("name") or "")
        if name and self._stored(kind, namespace, name) is not None:
            raise error(
                409,
                "AlreadyExists",
                f'{kind.plural} "{name}" already exists',
                name=name,
                group=kind.group,
                kind=kind.plural,
            )
        obj["apiVersion"] = kind.api_version
        obj["kind"] = kind.kind
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(transient, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        if kind.has_status:
            meta["generation"] = 1
            if kind.status_on_create is not None:
                obj["status"] = copy.deepcopy(dict(kind.status_on_create))
            elif not kind.keep_status_on_create:
                obj.pop("status", None)
        errors = self._meta_errors(kind, meta, None) + self._spec_errors(kind, obj)
        if kind.schema is not None:
            errors += admission.field_errors(kind.schema, obj)
        if errors:
            raise self._invalid(kind, name, errors)
        meta["resourceVersion"] = self._next_rv()
        self._write(kind, obj)
        self._emit(kind, "ADDED", obj, None)
        return copy.deepcopy(obj)

    # -- admission --------------------------------------------------------------------------

    def _decode(
        self, kind: Kind, body: Mapping[str, Any], field_validation: str = "Warn"
    ) -> dict[str, Any]:
        """A request body as the apiserver decodes it: unknown fields pruned (ObjectMeta's
        for every kind; by the schema, then defaulted, for a custom resource).

        What was pruned is kept in ``pruned_fields`` and answered as Warning headers; with
        ``fieldValidation=Strict`` (kubectl's default) it is refused with 400 instead, as
        the apiserver does ("Field validation",
        https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation).
        """
        obj: dict[str, Any]
        if kind.schema is not None:
            pruned, removed = admission.prune(kind.schema, dict(body))
            obj = admission.default(kind.schema, pruned)
        else:
            obj = copy.deepcopy(dict(body))
            meta, removed = admission.object_meta(obj.get("metadata") or {})
            if "metadata" in obj:
                obj["metadata"] = meta
        if removed and field_validation.lower() == "strict":
            unknown = ", ".join(f'unknown field "{path}"' for path in removed)
            raise error(
                400,
                "BadRequest",
                f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: '
                f"strict decoding error: {unknown}",
            )
        meta = obj.get("metadata") or {}
        for path in removed:
            self.pruned_fields.append((kind.plural, str(meta.get("name") or ""), path))
            self.warnings.append(f'unknown field "{path}"')
        return obj

    def _meta_errors(
        self, kind: Kind, meta: Mapping[str, Any], old: Mapping[str, Any] | None
    ) -> list[admission.FieldError]:
        """ObjectMeta's errors: the name by the kind's rule (on create, ``old`` None),
        labels, annotations, finalizers (their warnings go to ``warnings``).

        The emulator lacks these; the fixture supplies them as the apiserver's
        ValidateObjectMeta does ("Object Names and IDs",
        https://kubernetes.io/docs/concepts/overview/working-with-objects/names/).
        """
        errors, warnings = admission.finalizer_errors(meta, old, kind.builtin)
        self.warnings += warnings
        if old is None:
            prefix = str(meta.get("generateName") or "")
            if prefix:
                errors += admission.name_errors(
                    kind.name_rule, prefix, "metadata.generateName", prefix=True
                )
            name = str(meta.get("name") or "")
            if not name:
                errors.append(
                    admission.FieldError(
                        "metadata.name",
                        "FieldValueRequired",
                        detail="name or generateName is required",
                    )
                )
            else:
                errors += admission.name_errors(kind.name_rule, name, "metadata.name")
        return errors + admission.metadata_errors(meta)

    @staticmethod
    def _spec_errors(kind: Kind, obj: Mapping[str, Any]) -> list[admission.FieldError]:
        """What the apiserver's validation checks of a pod's spec here (the rest is not
        checked): admission.pod_spec_errors; of a PodDisruptionBudget's:
        disruption.budget_errors."""
        if kind.key == ("policy", "v1", "poddisruptionbudgets"):
            return budget_errors(obj.get("spec") or {})
        if kind.key != ("", "v1", "pods"):
            return []
        return admission.pod_spec_errors(obj.get("spec") or {})

    @staticmethod
    def _invalid(kind: Kind, name: str, errors: list[admission.FieldError]) -> Exception:
        """A 422 Invalid as the apiserver answers it: the message, and a cause per error."""
        return error(
            422,
            "Invalid",
            admission.invalid_message(kind.qualified, name, errors),
            name=name,
            group=kind.group,
            kind=kind.kind,
            causes=[e.cause() for e in errors],
        )

    def replace_object(
        self,
        kind: str | Kind,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
        subresource: str | None = None,
        field_validation: str = "Warn",
    ) -> dict[str, Any]:
        """Replace an object (or its status) as a PUT does; returns the result.

        The emulator lacks this (it does not serve PUT at all, so no replace and no
        resourceVersion precondition: 409 Conflict when stale); the fixture supplies it.
        """
        kind = kind if isinstance(kind, Kind) else self.kind(kind)
        old = self.get_object(kind, name, namespace)
        new = self._decode(kind, body, field_validation)
        given_rv = (new.get("metadata") or {}).get("resourceVersion")
        if not given_rv and not kind.builtin and subresource is None:
            raise error(
                422,
                "Invalid",
                f'{kind.kind}.{kind.group} "{name}" is invalid: metadata.resourceVersion: '
                "Invalid value: 0x0: must be specified for an update",
                name=name,
                group=kind.group,
                kind=kind.kind,
            )
        return self._update(kind, old, new, subresource, given_rv or None)

    def patch_object(
        self,
        kind: str | Kind,
        name: str,
        body: Any,
        namespace: str | None = None,
        subresource: str | None = None,
        content_type: str = MERGE_PATCH,
        field_validation: str = "Warn",
    ) -> dict[str, Any]:
        """Patch an object (or its status) as a PATCH with ``content_type`` does.

        The emulator lacks this (it merges every body as nested dicts, replaces lists and
        cannot apply a JSON patch); the fixture supplies merge, strategic merge (built-in
        kinds only; 415 for custom resources, as a real server) and JSON patches.
        """
        kind = kind if isinstance(kind, Kind) else self.kind(kind)
        old = self.get_object(kind, name, namespace)
        base = self._scale_of(kind, old) if subresource == "scale" else old
        try:
            if content_type == JSON_PATCH:
                new = json_patch(base, body)
            elif content_type == MERGE_PATCH:
                new = merge_patch(base, body)
            elif content_type == STRATEGIC_MERGE_PATCH and kind.builtin:
                new = strategic_merge_patch(base, body)
            else:
                raise error(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {JSON_PATCH}, {MERGE_PATCH}"
                    + (f", {STRATEGIC_MERGE_PATCH}" if kind.builtin else ""),
                )
        except PatchError as exc:
            raise error(422, "Invalid", str(exc), name=name, kind=kind.kind) from exc
        if not isinstance(new, dict):
            raise error(422, "Invalid", "the patched object is not an object", name=name)
        if subresource != "scale":
            new = self._decode(kind, new, field_validation)
        given_rv = (new.get("metadata") or {}).get("resourceVersion")
        return self._update(kind, old, new, subresource, given_rv or None)

    def _scale_of(self, kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        status: dict[str, Any] = {"replicas": _get_path(obj, kind.status_replicas_path) or 0}
        if kind.label_selector_path:
            status["selector"] = _get_path(obj, kind.label_selector_path) or ""
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": _get_path(obj, kind.spec_replicas_path) or 0},
            "status": status,
        }

    def _update(
        self,
        kind: Kind,
        old: dict[str, Any],
        new: dict[str, Any],
        subresource: str | None,
        given_rv: str | None,
    ) -> dict[str, Any]:
        """Apply a replace or patch result: subresource rules, preconditions, finalizers.

        The emulator lacks the status subresource (a write to /status changes the whole
        object, and one to the object changes its status); the fixture supplies it: a write
        to /status changes only .status, a write to the object leaves .status alone, and
        generation grows only when something besides metadata and status changes.
        """
        meta_old = old["metadata"]
        name = meta_old["name"]
        if given_rv is not None and given_rv != meta_old["resourceVersion"]:
            raise error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name=name,
                group=kind.group,
                kind=kind.plural,
            )
        if subresource == "status" and kind.has_status:
            # The emulator lacks this (a /status write changes the whole object); the fixture
            # supplies it: only .status changes.
            result = copy.deepcopy(old)
            if new.get("status") is None:
                result.pop("status", None)
            else:
                result["status"] = new["status"]
        elif subresource == "scale" and "scale" in kind.subresources:
            replicas = (new.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise error(422, "Invalid", "spec.replicas must be a non-negative integer")
            result = copy.deepcopy(old)
            _set_path(result, kind.spec_replicas_path, replicas)
        elif subresource is None:
            result = new
            result["apiVersion"] = kind.api_version
            result["kind"] = kind.kind
            meta = result.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise error(400, "BadRequest", "metadata must be an object")
            for fixed in (
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if fixed in meta_old:
                    meta[fixed] = meta_old[fixed]
                else:
                    meta.pop(fixed, None)
            if kind.has_status:
                # A write to the object itself leaves .status alone when there is a status
                # subresource (as on a real server).
                if "status" in old:
                    result["status"] = copy.deepcopy(old["status"])
                else:
                    result.pop("status", None)
        else:
            raise error(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        result["metadata"]["resourceVersion"] = meta_old["resourceVersion"]
        errors: list[admission.FieldError] = []
        if subresource is None:
            errors += self._meta_errors(kind, result["metadata"], meta_old)
            errors += self._spec_errors(kind, result)
        if kind.schema is not None:
            errors += admission.field_errors(kind.schema, result, old)
        if errors:
            raise self._invalid(kind, name, errors)
        if result == old:
            return old  # a real server writes nothing for a no-op: no new version, no event
        if kind.has_status and _without_meta_and_status(result) != _without_meta_and_status(old):
            result["metadata"]["generation"] = meta_old.get("generation", 1) + 1
        result["metadata"]["resourceVersion"] = self._next_rv()
        self._write(kind, result)
        self._emit(kind, "MODIFIED", result, old)
        meta_new = result["metadata"]
        if meta_new.get("deletionTimestamp") and not meta_new.get("finalizers"):
            self._remove(kind, result)
        return copy.deepcopy(result)

    def delete_object(
        self,
        kind: str | Kind,
        name: str,
        namespace: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Delete an object as a DELETE does; returns its last state.

        With finalizers, it only gets a deletionTimestamp (the object goes once they are
        removed). Without, it goes at once, and so do its dependents (garbage collection).
        """
        kind = kind if isinstance(kind, Kind) else self.kind(kind)
        options = options or {}
        obj = self.get_object(kind, name, namespace)
        meta = obj["metadata"]
        pre = options.get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            if pre.get(field_name) and pre[field_name] != meta.get(field_name):
                raise error(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.plural} "{name}": Precondition '
                    f"failed: {field_name}: {pre[field_name]}, object's {field_name}: "
                    f"{meta.get(field_name)}",
                    name=name,
                    group=kind.group,
                    kind=kind.plural,
                )
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return obj
            old = copy.deepcopy(obj)
            meta["deletionTimestamp"] = now()
            meta["deletionGracePeriodSeconds"] = 0
            meta["resourceVersion"] = self._next_rv()
            self._write(kind, obj)
            self._emit(kind, "MODIFIED", obj, old)
            return copy.deepcopy(obj)
        self._remove(kind, obj, orphan=options.get("propagationPolicy") == "Orphan")
        return obj

    def _remove(self, kind: Kind, obj: dict[str, Any], orphan: bool = False) -> None:
        meta = obj["metadata"]
        key = (kind.resource, meta.get("namespace"), meta["name"])
        self._rv += 1
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self.objects[key].delete()
        self._emit(kind, "DELETED", gone, obj)
        self._collect_garbage(meta["uid"], orphan)

    def _collect_garbage(self, owner_uid: str, orphan: bool) -> None:
        """Delete (or, for Orphan, release) every dependent of the owner just deleted.

        The emulator lacks this (nothing acts on ownerReferences); the fixture supplies it as
        the controller-manager's garbage collector would, at once instead of eventually.
        """
        for kind in list(self._kinds.values()):
            for namespace, name, dependent in list(self._items(kind)):
                refs = dependent.get("metadata", {}).get("ownerReferences") or []
                if not any(ref.get("uid") == owner_uid for ref in refs):
                    continue
                if self._stored(kind, namespace, name) is None:
                    continue  # went already, with an earlier owner of its own
                if orphan:
                    kept = [ref for ref in refs if ref.get("uid") != owner_uid]
                    self.patch_object(
                        kind, name, {"metadata": {"ownerReferences": kept or None}}, namespace
                    )
                else:
                    self.delete_object(kind, name, namespace)

    def compact(self) -> int:
        """Drop every resource's event history up to now; returns the compacted version.

        A watch from an older resourceVersion then gets the 410 Expired ERROR event. The
        emulator lacks this (it has no history at all); the fixture supplies it.
        """
        for key in self._log:
            self._log[key] = []
            self._compacted[key] = self._rv
        return self._rv

    def break_watches(self) -> int:
        """End every open watch stream (the server closes them); returns how many.

        A client sees its stream end cleanly and must watch again from its last
        resourceVersion. The emulator lacks this; the fixture supplies it.
        """
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        return len(self._watchers)

    def close_watches(self) -> None:
        """End every open watch and refuse new ones (for shutting the server down)."""
        self._closing = True
        self.break_watches()

    def watch_count(self, kind: str | Kind | None = None) -> int:
        """How many watch streams are open (on ``kind``, if given)."""
        if kind is None:
            return len(self._watchers)
        key = (kind if isinstance(kind, Kind) else self.kind(kind)).key
        return sum(1 for watcher in self._watchers if watcher.key == key)

    async def wait_for_watch(self, kind: str | Kind, count: int = 1, within: float = 10.0) -> None:
        """Wait until at least ``count`` watches are open on ``kind``."""
        async with asyncio.timeout(within):
            while self.watch_count(kind) < count:
                changed = self._watchers_changed
                await changed.wait()

    def _watchers_updated(self) -> None:
        self._watchers_changed.set()
        self._watchers_changed = asyncio.Event()

    async def _serve_version(self, request: kmock.Request) -> kmock.Payload:
        """The APIResourceList of a group version.

        The emulator lacks a correct one (``groupVersion: "/v1"`` for the core group,
        subresources with their resource's verbs); the fixture supplies it.
        """
        res = request.resource
        assert res is not None
        kinds = [
            k for k in self._kinds.values() if (k.group, k.version) == (res.group, res.version)
        ]
        if not kinds:
            raise error(404, "NotFound", "the server could not find the requested resource")
        resources: list[dict[str, Any]] = []
        for kind in kinds:
            verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]
            resources.append(
                {
                    "name": kind.plural,
                    "singularName": kind.singular,
                    "namespaced": kind.namespaced,
                    "kind": kind.kind,
                    "verbs": [*verbs, "watch"],
                    "shortNames": list(kind.shortnames),
                }
            )
            for sub in kind.subresources:
                of = _SUBRESOURCE_KINDS.get(sub, {"kind": kind.kind})
                resources.append(
                    {
                        "name": f"{kind.plural}/{sub}",
                        "singularName": "",
                        "namespaced": kind.namespaced,
                        "verbs": ["create"] if sub == "eviction" else ["get", "patch", "update"],
                        **of,
                    }
                )
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": kinds[0].api_version,
            "resources": resources,
        }

    # -- HTTP -------------------------------------------------------------------------------

    @staticmethod
    def _is_resource_request(request: kmock.Request) -> bool:
        return request.resource is not None and bool(request.resource.plural)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock's emulator changes its store here before any handler runs, with its own
        # simplified rules; every change is made by _serve_resource instead, so skip it.
        if self._is_resource_request(request):
            self.requests[self._verb(request), self._resource_name(request)] += 1
        return await kmock.KubernetesScaffold._handle(self, request)

    @staticmethod
    def _verb(request: kmock.Request) -> str:
        """The request's verb as the apiserver's audit log names it.

        A GET is ``watch`` with ``watch=true``, ``list`` without a name, else ``get``; a
        DELETE without a name is ``deletecollection``.
        """
        method = str(request.method.value).upper()
        named = request.name is not None
        if method == "GET":
            if str(request.params.get("watch", "")).lower() in ("true", "1"):
                return "watch"
            return "get" if named else "list"
        if method == "DELETE":
            return "delete" if named else "deletecollection"
        return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())

    @staticmethod
    def _resource_name(request: kmock.Request) -> str:
        res = request.resource
        assert res is not None
        sub = request.subresource
        return f"{res.plural}/{sub}" if sub else str(res.plural)

    def reset_requests(self) -> None:
        """Forget every request counted so far."""
        self.requests.clear()

    def _kind_for(self, request: kmock.Request) -> Kind:
        res = request.resource
        assert res is not None
        kind = self._kinds.get((res.group or "", res.version or "", res.plural or ""))
        if kind is None or (request.namespace is not None and not kind.namespaced):
            raise error(404, "NotFound", "the server could not find the requested resource")
        return kind

    async def _serve_resource(self, request: kmock.Request) -> kmock.Payload:
        self.warnings = []
        response = self._answer(request)
        if self.warnings and isinstance(response, KResponse):
            # One Warning header, its values comma-separated (RFC 9110), as a client reads it.
            shown = ", ".join(f"299 - {json.dumps(text)}" for text in self.warnings)
            response = attrs.evolve(response, headers={"Warning": shown})
        return response

    def _answer(self, request: kmock.Request) -> kmock.Payload:
        kind = self._kind_for(request)
        method = str(request.method.value).upper()
        params = request.params
        validation = str(params.get("fieldValidation") or "Warn")
        name, sub = request.name, request.subresource
        if sub is not None and (sub not in kind.subresources or name is None):
            raise error(404, "NotFound", "the server could not find the requested resource")
        if sub == "eviction":
            if method != "POST":
                raise error(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            return self._evict(request, kind)
        if method == "GET" and str(params.get("watch", "")).lower() in ("true", "1"):
            return KResponse(status=200, payload=self._serve_watch_stream(request, kind))
        if method == "GET" and name is None:
            return KResponse(status=200, payload=self._list(request, kind))
        if kind.namespaced and request.namespace is None:
            raise error(404, "NotFound", "the server could not find the requested resource")
        if method == "GET":
            obj = self.get_object(kind, name or "", request.namespace)
            return KResponse(
                status=200, payload=self._scale_of(kind, obj) if sub == "scale" else obj
            )
        body = self._body(request)
        if method == "POST" and name is None:
            if not isinstance(body, dict):
                raise error(400, "BadRequest", "the body is not an object")
            created = self.create_object(kind, body, request.namespace, validation)
            return KResponse(status=201, payload=created)
        if method == "PUT" and name is not None:
            if not isinstance(body, dict):
                raise error(400, "BadRequest", "the body is not an object")
            if sub == "scale":
                obj = self.patch_object(kind, name, body, request.namespace, sub, MERGE_PATCH)
                return KResponse(status=200, payload=self._scale_of(kind, obj))
            obj = self.replace_object(kind, name, body, request.namespace, sub, validation)
            return KResponse(status=200, payload=obj)
        if method == "PATCH" and name is not None:
            content_type = self._content_type(request)
            obj = self.patch_object(
                kind, name, body, request.namespace, sub, content_type, validation
            )
            payload = self._scale_of(kind, obj) if sub == "scale" else obj
            return KResponse(status=200, payload=payload)
        if method == "DELETE":
            options = dict(body) if isinstance(body, dict) else {}
            if "propagationPolicy" in params:
                options["propagationPolicy"] = params["propagationPolicy"]
            if name is None:
                return KResponse(status=200, payload=self._delete_many(request, kind, options))
            obj = self.delete_object(kind, name, request.namespace, options)
            if kind.delete_returns_object or obj["metadata"].get("deletionTimestamp"):
                return KResponse(status=200, payload=obj)
            return KResponse(status=200, payload=self._success(kind, obj))
        raise error(405, "MethodNotAllowed", f"the server does not allow this method: {method}")

    def _evict(self, request: kmock.Request, kind: Kind) -> kmock.Payload:
        """``POST .../pods/NAME/eviction``: delete the pod unless a PodDisruptionBudget
        refuses it (disruption.py).

        The emulator lacks this (and PodDisruptionBudgets); the fixture supplies it.
        """
        name, namespace = request.name or "", request.namespace
        body = self._body(request)
        # As the apiserver decodes it: a body without apiVersion and kind is taken as the
        # endpoint's kind (the official client sends none).
        if not isinstance(body, dict) or body.get("kind", "Eviction") != "Eviction":
            raise error(400, "BadRequest", "the body is not an Eviction")
        if (body.get("metadata") or {}).get("name") != name:
            raise error(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = self.get_object(kind, name, namespace)
        budgets = self.current(self.kind("poddisruptionbudgets"), namespace)
        refusal = eviction_refusal(pod, budgets, self.current(kind), self._controller_scale)
        if refusal is not None:
            code, reason, message, causes = refusal
            raise (
                error(code, reason, message, causes=causes)
                if causes
                else error(code, reason, message)
            )
        self.delete_object(kind, name, namespace, body.get("deleteOptions") or {})
        return KResponse(
            status=201,
            payload={
                "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success",
                "code": 201,
            },
        )  # fmt: skip

    def _controller_scale(self, owner: Mapping[str, Any], namespace: str) -> int | None:
        """The ``spec.replicas`` of a pod's controller through its scale subresource; None
        where its kind has none (or it is not there), as the disruption controller finds."""
        group, _, version = str(owner.get("apiVersion") or "").rpartition("/")
        kind = next(
            (
                k for k in self._kinds.values()
                if (k.group, k.version, k.kind) == (group, version, owner.get("kind"))
            ),
            None,
        )  # fmt: skip
        if kind is None or "scale" not in kind.subresources:
            return None
        found = self._stored(kind, namespace, str(owner.get("name")))
        replicas = None if found is None else _get_path(found, kind.spec_replicas_path)
        return replicas if isinstance(replicas, int) else None

    @staticmethod
    def _body(request: kmock.Request) -> Any:
        if not request.body:
            return None
        try:
            return json.loads(request.body)
        except ValueError as exc:
            raise error(400, "BadRequest", f"the body is not JSON: {exc}") from exc

    @staticmethod
    def _content_type(request: kmock.Request) -> str:
        for key, value in request.headers.items():
            if key.lower() == "content-type":
                return str(value).split(";")[0].strip().lower()
        return ""

    @staticmethod
    def _success(kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": meta["name"],
                "group": kind.group,
                "kind": kind.plural,
                "uid": meta["uid"],
            },
        }

    def _matcher(self, request: kmock.Request, kind: Kind) -> Any:
        """The request's namespace, name, labelSelector and fieldSelector as a predicate.

        The emulator lacks the selectors (it ignores both); the fixture supplies them.
        """
        try:
            labels = label_selector(request.params.get("labelSelector"))
            fields = field_selector(request.params.get("fieldSelector"), kind.plural)
        except SelectorError as exc:
            raise error(400, "BadRequest", str(exc)) from exc
        namespace, name = request.namespace, request.name

        def matches(obj: Mapping[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and (name is None or meta.get("name") == name)
                and labels(obj)
                and fields(obj)
            )

        return matches

    def _list(self, request: kmock.Request, kind: Kind) -> dict[str, Any]:
        """A list with the cluster's resourceVersion, filtered by the selectors.

        The emulator lacks the resourceVersion (it answers '...') and the selectors; the
        fixture supplies them.
        """
        matches = self._matcher(request, kind)
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": [obj for obj in self.current(kind) if matches(obj)],
        }

    def _delete_many(
        self, request: kmock.Request, kind: Kind, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        matches = self._matcher(request, kind)
        deleted = []
        for obj in self.current(kind):
            meta = obj["metadata"]
            if matches(obj) and self._stored(kind, meta.get("namespace"), meta["name"]):
                deleted.append(
                    self.delete_object(kind, meta["name"], meta.get("namespace"), options)
                )
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": deleted,
        }

    async def _serve_watch_stream(
        self, request: kmock.Request, kind: Kind
    ) -> AsyncIterator[kmock.Payload]:
        """A watch stream, from ``resourceVersion`` if given, else from a replay of all.

        The emulator lacks this (it always replays everything as ADDED, then follows, and
        ignores resourceVersion, timeoutSeconds and selectors); the fixture supplies it.
        """
        matches = self._matcher(request, kind)
        since_text = str(request.params.get("resourceVersion", ""))
        timeout_text = str(request.params.get("timeoutSeconds", ""))
        bookmarks = str(request.params.get("allowWatchBookmarks", "")).lower() in ("true", "1")
        try:
            since = int(since_text) if since_text not in ("", "0") else None
            timeout = float(timeout_text) if timeout_text else math.inf
        except ValueError as exc:
            raise error(400, "BadRequest", f"invalid watch parameter: {exc}") from exc
        if self._closing:
            raise error(503, "ServiceUnavailable", "the server is shutting down")

        # Everything up to registering the watcher happens without awaiting: no event can be
        # missed or seen twice between the backlog and the live queue.
        watcher = _Watcher(kind.key)
        backlog: list[dict[str, Any]] = []
        if since is None:
            backlog = [{"type": "ADDED", "object": obj} for obj in self.current(kind)]
            backlog = [event for event in backlog if matches(event["object"])]
        elif since < self._compacted[kind.key]:
            backlog = [self._expired(since, kind)]
            watcher.queue.put_nowait(None)
        else:
            for event in self._log[kind.key]:
                if event.rv > since:
                    watcher.queue.put_nowait(event)
        self._watchers.add(watcher)
        self._watchers_updated()
        try:
            yield b""  # send the headers now: the stream is open even if nothing happens
            for item in backlog:
                yield item
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            next_bookmark = loop.time() + self.bookmark_interval if bookmarks else math.inf
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    if bookmarks:
                        # As the apiserver does just before a watch's timeout: what was
                        # written before it is sent, then a bookmark of the version reached.
                        while not watcher.queue.empty():
                            pending = watcher.queue.get_nowait()
                            if pending is None:
                                return
                            shown = self._as_seen(pending, matches)
                            if shown is not None:
                                yield shown
                        yield self._bookmark(kind)
                    return
                wait = min(remaining, next_bookmark - loop.time())
                if not watcher.queue.empty():
                    change = watcher.queue.get_nowait()
                elif wait <= 0:
                    yield self._bookmark(kind)
                    next_bookmark = loop.time() + self.bookmark_interval
                    continue
                else:
                    try:
                        change = await asyncio.wait_for(
                            watcher.queue.get(), None if math.isinf(wait) else wait
                        )
                    except TimeoutError:
                        continue
                if change is None:
                    return
                shown = self._as_seen(change, matches)
                if shown is not None:
                    yield shown
        finally:
            self._watchers.discard(watcher)
            self._watchers_updated()

    def _bookmark(self, kind: Kind) -> dict[str, Any]:
        """A BOOKMARK event: every change up to the cluster's current version was sent.

        Only called with the watcher's queue empty: every event of ``kind`` up to now has
        been put on it (writes enqueue without awaiting) and taken off, so a watch resumed
        from this version misses nothing. The emulator lacks bookmarks; the fixture
        supplies them as the apiserver's watch cache does (an object holding only kind,
        apiVersion and metadata.resourceVersion).
        """
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": kind.kind,
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self._rv)},
            },
        }

    @staticmethod
    def _as_seen(event: WatchEvent, matches: Any) -> dict[str, Any] | None:
        """The event as a watch with selectors sees it: objects entering or leaving the
        selection are ADDED or DELETED for it, as on a real server."""
        now_in = bool(matches(event.object))
        was_in = event.old is not None and bool(matches(event.old))
        if event.type == "MODIFIED":
            type_ = (
                "MODIFIED"
                if now_in and was_in
                else "ADDED"
                if now_in
                else "DELETED"
                if was_in
                else None
            )
        else:
            type_ = event.type if now_in else None
        return None if type_ is None else {"type": type_, "object": event.object}

    def _expired(self, since: int, kind: Kind) -> dict[str, Any]:
        return {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {since} ({self._compacted[kind.key]})",
                "reason": "Expired",
                "code": 410,
            },
        }
