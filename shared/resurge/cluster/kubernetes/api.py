"""The Kubernetes API as resurge uses it: the TrainingJob CRD's names, the client of the
cluster resurge runs in, and :class:`KubeApi`, which makes each call of the official
client off the event loop, a refusal becoming a
:class:`~resurge.cluster.protocol.BackendError` that names what was attempted (a 404
stays an ``ApiException``: absent is an answer, which :meth:`KubeApi.read` and
:meth:`KubeApi.delete` turn into None and False). The backend and its controller both
talk to the cluster through it; every writer of a TrainingJob's status writes through
:meth:`KubeApi.update_training_job_status` (read, change, patch with the
resourceVersion read as a precondition, again on 409). A TrainingJob is named by its
bus name (:mod:`.identity`): ``llama`` in the install's own namespace, ``team-b/llama``
in another."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from resurge.cluster.kubernetes.identity import kube_name
from resurge.cluster.protocol import BackendError

__all__ = [
    "CRD_GROUP",
    "CRD_PLURAL",
    "CRD_VERSION",
    "MERGE_PATCH",
    "STATUS_WRITE_ATTEMPTS",
    "KubeApi",
    "api_client",
    "conflict",
    "json_of",
]

CRD_GROUP = "resurge.dev"
CRD_VERSION = "v1alpha1"
CRD_PLURAL = "trainingjobs"
MERGE_PATCH = "application/merge-patch+json"

T = TypeVar("T")

log = logging.getLogger("resurge.cluster.kubernetes")

# A status write that loses this many races in a row gives up (logged; the next change
# of the status writes it again).
STATUS_WRITE_ATTEMPTS = 5


def api_client() -> k8s.ApiClient:
    """A client for the cluster this runs in (its service account), else for the
    current context of ``$KUBECONFIG`` (or ``~/.kube/config``)."""
    configuration = k8s.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        # The client reads $KUBECONFIG once, when imported; read it now.
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration
        )
    return k8s.ApiClient(configuration)


def json_of(response: Any) -> dict[str, Any]:
    """The body of a response read with ``_preload_content=False``."""
    data: dict[str, Any] = json.loads(response.data)
    return data


def _missing(error: Exception) -> bool:
    """Whether ``error`` is the API server's 404."""
    return isinstance(error, ApiException) and error.status == 404


def conflict(error: Exception) -> bool:
    """Whether ``error`` (as :meth:`KubeApi.call` raises it) is the API server's 409
    Conflict: a precondition failed or the object exists already."""
    cause = error.__cause__
    return isinstance(cause, ApiException) and cause.status == 409


class KubeApi:
    """The core, coordination (Leases), policy (PodDisruptionBudgets) and custom-object
    APIs of one client.
    ``namespace`` is the install's own (its Leases; a TrainingJob there keeps its name
    on the bus); ``namespaces`` those whose TrainingJobs it serves, None: every one."""

    def __init__(
        self, api: k8s.ApiClient, namespace: str, namespaces: tuple[str, ...] | None = None
    ) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.coordination = k8s.CoordinationV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.policy = k8s.PolicyV1Api(api)
        self.namespace = namespace
        self.namespaces = namespaces

    def locate(self, job: str) -> tuple[str, str]:
        """The namespace and name of the TrainingJob whose bus name is ``job``."""
        return kube_name(job, self.namespace)

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread; an error but 404 as a BackendError
        naming ``what``."""
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as error:
            if error.status == 404:
                raise
            raise BackendError(f"{what}: {error.status} {error.reason}") from error

    async def read(
        self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any] | None:
        """The object ``fn(*args, **kwargs)`` reads (or writes), as JSON; None where the
        API answers 404. Other errors as :meth:`call` raises them."""
        try:
            got = await self.call(what, fn, *args, **kwargs, _preload_content=False)
        except ApiException as error:
            if _missing(error):
                return None
            raise
        return json_of(got)

    async def delete(self, what: str, fn: Callable[..., Any], *args: Any) -> bool:
        """Delete by ``fn(*args)``; False where it was gone already (404)."""
        try:
            await self.call(what, fn, *args, _preload_content=False)
        except ApiException as error:
            if _missing(error):
                return False
            raise
        return True

    async def training_job(self, job: str) -> dict[str, Any] | None:
        """The TrainingJob whose bus name is ``job``; None if none is (a job submitted
        with ``resurge submit``, or a name no object can have)."""
        namespace, name = self.locate(job)
        try:
            return await self.read(
                f"read TrainingJob {job}",
                self.custom.get_namespaced_custom_object,
                CRD_GROUP,
                CRD_VERSION,
                namespace,
                CRD_PLURAL,
                name,
            )
        except ValueError:  # a name the client refuses to put in a path
            return None

    async def update_training_job_status(
        self, job: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> bool:
        """Merge ``change(training_job)`` (fields of ``status``; None: nothing to write)
        into TrainingJob ``job``'s status by read-modify-write: the patch carries the
        ``metadata.resourceVersion`` read as a precondition, and on 409 Conflict (another
        writer came first) the object is read again and ``change`` called anew. Whether
        it was written (False: the TrainingJob is gone, nothing to write, or every one of
        :data:`STATUS_WRITE_ATTEMPTS` attempts lost its race, which is logged)."""
        namespace, name = self.locate(job)
        for _ in range(STATUS_WRITE_ATTEMPTS):
            training_job = await self.training_job(job)
            if training_job is None:
                return False
            fields = change(training_job)
            if fields is None:
                return False
            version = (training_job.get("metadata") or {}).get("resourceVersion")
            body = {"metadata": {"resourceVersion": version}, "status": fields}
            try:
                written = await self.read(
                    f"patch the status of TrainingJob {job}",
                    self.custom.patch_namespaced_custom_object_status,
                    CRD_GROUP,
                    CRD_VERSION,
                    namespace,
                    CRD_PLURAL,
                    name,
                    body,
                    _content_type=MERGE_PATCH,
                )
            except BackendError as error:
                if conflict(error):
                    continue
                raise
            return written is not None  # None: gone meanwhile
        log.warning("status of TrainingJob %s: lost %d races in a row", job, STATUS_WRITE_ATTEMPTS)
        return False
