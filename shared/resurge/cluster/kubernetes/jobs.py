"""The controller's TrainingJob loop: TrainingJobs of one namespace in, job submissions
and deletions out.

Each TrainingJob becomes a job submission on the bus (``JobSubmitted``, as ``resurge
submit`` publishes), once per spec: the digest of the spec last submitted is kept in
``status.submittedSpec``, so a restarted controller submits nothing twice. A spec that
does not validate gets ``phase: Failed``, the message naming the field, and a Warning
Event. A deleted TrainingJob is ``JobDeleted``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from resurge.cluster.kubernetes.api import CRD_GROUP, CRD_PLURAL, CRD_VERSION, KubeApi
from resurge.cluster.kubernetes.watch import SYNCED, follow, raise_if_cancelled
from resurge.cluster.protocol import BackendError
from resurge.events import JobDeleted, JobSubmitted
from resurge.jobspec import JobSpecError, parse_job

if TYPE_CHECKING:
    from resurge.runtime.bus import Bus

__all__ = ["TrainingJobs", "name_of", "spec_digest"]

log = logging.getLogger("resurge.cluster.kubernetes")


def spec_digest(training_job: dict[str, Any]) -> str:
    """A short digest of a TrainingJob's spec (and labels): what was submitted."""
    meta = training_job.get("metadata") or {}
    text = json.dumps(
        {"spec": training_job.get("spec"), "labels": meta.get("labels") or {}}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def name_of(obj: dict[str, Any]) -> str:
    """An object's ``metadata.name`` ("" where it has none)."""
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


class TrainingJobs:
    """The TrainingJob loop (module docstring); ``known`` holds each TrainingJob as last
    seen, ``gone`` the names of those deleted."""

    def __init__(self, kube: KubeApi, bus: Bus) -> None:
        self.kube = kube
        self.bus = bus
        self.namespace = kube.namespace
        self.known: dict[str, dict[str, Any]] = {}
        self.gone: set[str] = set()

    async def follow(self) -> None:
        """Submit each TrainingJob's spec once, and delete deleted ones, until cancelled."""
        async for kind, obj in follow(
            self.kube.custom.list_namespaced_custom_object,
            group=CRD_GROUP,
            version=CRD_VERSION,
            namespace=self.namespace,
            plural=CRD_PLURAL,
        ):
            if kind == SYNCED:
                continue
            try:
                await self.on_event(kind, obj)
            except Exception:  # one job's trouble never stops the others'
                log.exception("could not act on TrainingJob %s", name_of(obj))
            raise_if_cancelled()

    async def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """Act on one watch event of a TrainingJob (the module docstring)."""
        name = name_of(obj)
        if kind == "DELETED":
            self.known.pop(name, None)
            self.gone.add(name)
            await self.bus.publish(
                self.bus.subjects.job(name), JobDeleted(source=self.bus.source, job=name)
            )
            log.info("TrainingJob %s deleted", name, extra={"job": name})
            return
        self.known[name] = obj
        self.gone.discard(name)
        digest = spec_digest(obj)
        if (obj.get("status") or {}).get("submittedSpec") == digest:
            return
        meta = obj.get("metadata") or {}
        document = {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "metadata": {
                "name": name,
                "namespace": meta.get("namespace") or self.namespace,
                "labels": meta.get("labels") or {},
            },
            "spec": obj.get("spec"),
        }
        try:
            job = parse_job(document)
        except JobSpecError as error:
            log.warning("TrainingJob %s rejected: %s", name, error, extra={"job": name})
            await self._patch_status(
                name, {"phase": "Failed", "message": str(error), "submittedSpec": digest}
            )
            await self.event(obj, "InvalidSpec", str(error))
            return
        await self.bus.publish(
            self.bus.subjects.job(name), JobSubmitted(source=self.bus.source, job=name, spec=job)
        )
        await self._patch_status(name, {"submittedSpec": digest})
        log.info("TrainingJob %s submitted", name, extra={"job": name})

    async def _patch_status(self, name: str, status: dict[str, Any]) -> None:
        await self.kube.patch_training_job_status(name, {"status": status})

    async def event(
        self, training_job: dict[str, Any], reason: str, message: str, warning: bool = True
    ) -> None:
        """Record a Kubernetes Event on ``training_job`` (a failure to is logged only)."""
        from resurge.cluster.kubernetes.status import event

        try:
            await self.kube.call(
                f"record an Event on {name_of(training_job)}",
                self.kube.core.create_namespaced_event,
                self.namespace,
                event(training_job, reason, message, warning=warning),
                _preload_content=False,
            )
        except (BackendError, ApiException) as error:
            log.warning("could not record an Event: %r", error)
