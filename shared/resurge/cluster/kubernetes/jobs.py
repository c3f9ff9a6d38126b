"""The controller's TrainingJob loop: TrainingJobs of the served namespaces in
(:mod:`.scope`), job submissions and deletions out, and nothing of a deleted one left
behind. A TrainingJob is its bus name on the bus and here (:mod:`.identity`:
``team-b/llama`` outside the install's namespace); its pods, Services and Events are in
its own namespace.

- **Finalizer.** Every TrainingJob seen gets the finalizer ``resurge.dev/cleanup``
  (a merge patch preconditioned on its resourceVersion), so its deletion waits for the
  controller, even one that is down while it is deleted.
- **Submitted on metadata.generation.** A TrainingJob is submitted on the bus
  (``JobSubmitted``, as ``resurge submit`` publishes) when its ``metadata.generation``
  is newer than ``status.submittedGeneration``, which then records it: the API server
  bumps the generation on spec changes only, so a label, annotation or status change
  submits nothing, and a restarted controller submits nothing twice. A new generation
  of a job already submitted is a spec edit: submitted again as an ``update``, which
  the scaler applies to the running job (what may change: ``update_live``) and never
  starts, so a job that finishes meanwhile stays finished. A finished job
  (``status.phase`` Succeeded or Failed, or its status record says so) is not submitted
  again: it runs again only when deleted and created (a new object). A status with a
  phase but no ``submittedGeneration`` (an older resurge's) counts as submitted. A spec that does
  not validate gets ``phase: Failed``, the message naming the field, the ``Failed``
  condition and a Warning Event (``InvalidSpec``); an edit that does not validate is not
  applied, and the job runs on as it was, with a Warning Event (``InvalidEdit``).
- **Deleted.** A TrainingJob being deleted (``deletionTimestamp``, held by the
  finalizer) is ``JobDeleted`` on the bus; its pods and Services are deleted, then the
  finalizer removed. One gone without the finalizer (removed by hand, or deleted before
  it existed) is ``JobDeleted`` when the watch tells so.
- **Sweep at start.** Once the first list is in: pods and Services labelled
  ``resurge.dev/job`` whose TrainingJob is gone (or is another object of the same name)
  are deleted, and each job with worker-group records but no TrainingJob is
  ``JobDeleted``: on Kubernetes a job is a TrainingJob, and a pod is never made
  without one (its owner, its image, its template).
- **As Kueue admits it.** A queued job is submitted with the spec
  ``effective_spec`` gives (:mod:`.queueing`: ``spec.suspend`` true while Kueue admits
  none of it, as Kueue suspends the jobs it manages; ``replicas.max`` at most what it
  admits), and :meth:`TrainingJobs.resubmit` submits it again (an ``update``) when its
  admission changes, so the scaler suspends, shrinks, resumes or grows it; the
  TrainingJob itself is not edited.
- **Refused pods.** :meth:`TrainingJobs.refused` and :meth:`TrainingJobs.admitted` keep
  the ``PodsRefused`` condition (True with the API's message while the API refuses a
  pod or Service of the job; False again once one is created), with a Warning Event per
  refusal. The controller writes only its own conditions (:mod:`.conditions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from resurge.cluster.kubernetes.api import (
    CRD_GROUP,
    CRD_PLURAL,
    CRD_VERSION,
    MERGE_PATCH,
    KubeApi,
    conflict,
)
from resurge.cluster.kubernetes.conditions import condition, with_condition
from resurge.cluster.kubernetes.identity import bus_name
from resurge.cluster.kubernetes.objects import JOB_LABEL
from resurge.cluster.kubernetes.scope import Served
from resurge.cluster.kubernetes.watch import (
    SYNCED,
    Change,
    drain,
    raise_if_cancelled,
)
from resurge.cluster.protocol import BackendError
from resurge.events import JobDeleted, JobSubmitted
from resurge.jobspec import JobSpecError, parse_job
from resurge.jobspec.status import PODS_REFUSED

if TYPE_CHECKING:
    from resurge.cluster.local.backend import LocalBackend
    from resurge.runtime.bus import Bus

__all__ = [
    "FINALIZER",
    "PODS_REFUSED",
    "TrainingJobs",
    "name_of",
    "namespace_of",
    "rejected_status",
]

log = logging.getLogger("resurge.cluster.kubernetes")

FINALIZER = "resurge.dev/cleanup"
FINISHED = ("Succeeded", "Failed")
# An event not acted on is tried again after this long, doubled each time up to the most.
_RETRY_FIRST_SECONDS = 1.0
_RETRY_MAX_SECONDS = 60.0
_RETRY = "RETRY"


def name_of(obj: dict[str, Any]) -> str:
    """An object's ``metadata.name`` ("" where it has none)."""
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


def namespace_of(obj: dict[str, Any]) -> str:
    """An object's ``metadata.namespace`` ("" where it has none)."""
    meta = obj.get("metadata")
    return str(meta.get("namespace") or "") if isinstance(meta, dict) else ""


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, dict) else {}


def generation_of(obj: dict[str, Any]) -> int:
    """``metadata.generation`` (1 where the server set none, or none that counts)."""
    generation = _meta(obj).get("generation")
    if isinstance(generation, int) and not isinstance(generation, bool) and generation >= 1:
        return generation
    return 1


def _owners(obj: dict[str, Any]) -> set[str]:
    """The uids of the TrainingJobs that own ``obj``."""
    refs = _meta(obj).get("ownerReferences") or []
    return {
        str(r.get("uid"))
        for r in refs
        if isinstance(r, dict) and r.get("kind") == "TrainingJob" and r.get("uid")
    }


def rejected_status(before: dict[str, Any], generation: int, message: str) -> dict[str, Any]:
    """The status fields of a TrainingJob whose spec (of ``generation``) does not parse:
    Failed, the parser's message and the Failed condition; ``before`` is its status."""
    failed = condition("Failed", True, "InvalidSpec", message, generation)
    return {
        "phase": "Failed",
        "message": message,
        "submittedGeneration": generation,
        "observedGeneration": generation,
        "conditions": with_condition(before.get("conditions"), failed),
    }


class TrainingJobs:
    """The TrainingJob loop (module docstring); ``known`` holds each TrainingJob as last
    seen, ``gone`` the bus names of those deleted."""

    def __init__(self, kube: KubeApi, bus: Bus, records: LocalBackend) -> None:
        self.kube = kube
        self.bus = bus
        self.records = records
        self.served = Served(kube)
        self.known: dict[str, dict[str, Any]] = {}
        self.gone: set[str] = set()
        self._cleaned: set[str] = set()  # uids whose deletion was acted on
        self._held: set[tuple[str, int]] = set()  # (name, generation) not run: finished
        self._ownerless: set[str] = set()  # jobs told to have no TrainingJob
        # uid -> the generation this process submitted: a watch event may carry the
        # object as it was before the status that records it.
        self._submitted: dict[str, int] = {}
        # Called with each TrainingJob as seen (not deleted): the controller's Kueue side.
        self.observers: list[Callable[[dict[str, Any]], Awaitable[None]]] = []
        # The spec a TrainingJob is submitted with: as Kueue admits it, where queued.
        self.effective_spec: Callable[[dict[str, Any]], Any] = lambda obj: obj.get("spec")

    async def follow(self) -> None:
        """Act on every TrainingJob and each change (module docstring), until cancelled;
        sweep what deleted ones left once the first list is in. An event not acted on
        (an error) is tried again on the TrainingJob as last seen, after a delay that
        doubles with each failure, unless a newer event came meanwhile."""
        queue: asyncio.Queue[Change] = asyncio.Queue()
        listed: dict[str, str] = {}
        delays: dict[str, float] = {}

        async def watch() -> None:
            async with contextlib.aclosing(self.served.training_jobs()) as changes:
                async for change in changes:
                    await queue.put(change)

        def retry(obj: dict[str, Any]) -> None:
            name = self.job_of(obj)
            delay = min(_RETRY_MAX_SECONDS, delays.get(name, _RETRY_FIRST_SECONDS / 2) * 2)
            delays[name] = delay
            asyncio.get_running_loop().call_later(delay, queue.put_nowait, (_RETRY, obj))

        async with contextlib.aclosing(drain(queue, [watch()])) as changes:
            async for kind, obj in changes:
                name = self.job_of(obj) if kind != SYNCED else ""
                if kind == SYNCED:
                    await self._sweep_once(listed)
                elif kind == _RETRY and self.known.get(name) is not obj:
                    pass  # changed or deleted since: that event was acted on
                elif await self._act("MODIFIED" if kind == _RETRY else kind, obj):
                    delays.pop(name, None)
                elif kind != "DELETED":
                    retry(obj)
                if kind not in (SYNCED, _RETRY):
                    listed[name] = str(_meta(obj).get("uid") or "")
                raise_if_cancelled()

    async def _sweep_once(self, listed: dict[str, str]) -> None:
        try:
            await self.sweep(listed)
        except Exception:  # the next start sweeps again
            log.exception("could not sweep what deleted TrainingJobs left")

    async def _act(self, kind: str, obj: dict[str, Any]) -> bool:
        """:meth:`on_event`; False if it failed (logged)."""
        try:
            await self.on_event(kind, obj)
        except Exception:  # one job's trouble never stops the others'
            log.exception("could not act on TrainingJob %s; trying again", self.job_of(obj))
            return False
        return True

    def job_of(self, obj: dict[str, Any]) -> str:
        """The bus name of TrainingJob ``obj`` (:mod:`.identity`)."""
        return bus_name(namespace_of(obj) or self.kube.namespace, name_of(obj), self.kube.namespace)

    async def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """Act on one watch event of a TrainingJob (the module docstring)."""
        name = self.job_of(obj)
        meta = _meta(obj)
        if kind == "DELETED":
            self.known.pop(name, None)
            self.gone.add(name)
            await self._deleted(name, str(meta.get("uid") or ""))
            return
        self.known[name] = obj
        self.gone.discard(name)
        self._ownerless.discard(name)
        for observe in self.observers:
            await observe(obj)
        if meta.get("deletionTimestamp"):
            await self._deleting(obj)
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            patched = await self._add_finalizer(obj)
            if patched is None:
                return  # changed meanwhile: the watch brings the newer version
            obj = patched
        await self._submit(obj)

    # -- finalizer and deletion -----------------------------------------------------------

    async def _patch(self, job: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the TrainingJob (bus name ``job``) itself; None on 409 (its
        resourceVersion moved on) or 404."""
        namespace, name = self.kube.locate(job)
        try:
            return await self.kube.read(
                f"patch TrainingJob {job}",
                self.kube.custom.patch_namespaced_custom_object,
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
                return None
            raise

    async def _add_finalizer(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        meta = _meta(obj)
        finalizers = [*(meta.get("finalizers") or []), FINALIZER]
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        return await self._patch(self.job_of(obj), body)

    async def _deleting(self, obj: dict[str, Any]) -> None:
        """A TrainingJob being deleted: JobDeleted, its pods and Services deleted, then
        the finalizer removed (where it is still there)."""
        name, meta = self.job_of(obj), _meta(obj)
        uid = str(meta.get("uid") or "")
        if FINALIZER not in (meta.get("finalizers") or []):
            return  # done already; it goes with the others' finalizers
        await self._deleted(name, uid)
        while obj and FINALIZER in (_meta(obj).get("finalizers") or []):
            meta = _meta(obj)
            kept = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
            body = {
                "metadata": {"finalizers": kept or None, "resourceVersion": meta["resourceVersion"]}
            }
            if await self._patch(name, body) is not None:
                break
            obj = await self.kube.training_job(name) or {}  # 409: read it again
            if _meta(obj).get("uid") != uid:
                break
        log.info("TrainingJob %s: cleaned up, finalizer removed", name, extra={"job": name})

    async def _deleted(self, name: str, uid: str) -> None:
        """Tell the job deleted (once per object) and delete its pods and Services (a
        failure to is logged: they are owned by the TrainingJob, so the garbage
        collector deletes them once it is gone)."""
        self.gone.add(name)
        if uid not in self._cleaned:
            await self.bus.publish(
                self.bus.subjects.job(name), JobDeleted(source=self.bus.source, job=name)
            )
            self._cleaned.add(uid)
            log.info("TrainingJob %s deleted", name, extra={"job": name})
        try:
            await self._delete_dependents(name, uid)
        except (BackendError, ApiException) as error:
            log.warning("could not delete the pods and Services of %s: %r", name, error)

    async def _delete_dependents(self, job: str, uid: str) -> None:
        """Delete the pods and Services of ``job`` (in its namespace) that the
        TrainingJob ``uid`` owns, or no TrainingJob does."""
        namespace, name = self.kube.locate(job)
        for what in ("pods", "services"):
            for obj in await self.served.labelled_in(what, namespace, f"{JOB_LABEL}={name}"):
                owners = _owners(obj)
                if not owners or uid in owners:
                    await self._delete(what, obj)

    async def _delete(self, what: str, obj: dict[str, Any]) -> None:
        fn = (
            self.kube.core.delete_namespaced_pod
            if what == "pods"
            else self.kube.core.delete_namespaced_service
        )
        name = name_of(obj)
        namespace = namespace_of(obj) or self.kube.namespace
        await self.kube.delete(f"delete {what} {namespace}/{name}", fn, name, namespace)

    async def sweep(self, listed: dict[str, str]) -> None:
        """What TrainingJobs deleted while no controller ran left (``listed``: bus name
        -> uid of each TrainingJob there is): their pods and Services deleted, their
        jobs' records told deleted."""
        home = self.kube.namespace
        for what in ("pods", "services"):
            for obj in await self.served.labelled(what, JOB_LABEL):
                label = str(_meta(obj).get("labels", {}).get(JOB_LABEL) or "")
                job = bus_name(namespace_of(obj) or home, label, home)
                owners = _owners(obj)
                if job not in listed or (owners and listed[job] not in owners):
                    log.info("deleting %s %s: its TrainingJob is gone", what, name_of(obj))
                    await self._delete(what, obj)
        jobs = {g.job for g in await self.records.list_worker_groups()} - set(listed)
        for job in sorted(j for j in jobs if self.served.serves(self.kube.locate(j)[0])):
            await self.no_training_job(job)

    async def no_training_job(self, job: str) -> None:
        """``job`` has worker groups but no TrainingJob: it cannot run (no pod is made
        without its TrainingJob); say so, and tell it deleted. Silent for a job whose
        TrainingJob this controller saw deleted (its records are going)."""
        if job in self._ownerless or job in self.gone:
            return
        self._ownerless.add(job)
        log.warning(
            "job %s has no TrainingJob: on Kubernetes a job is a TrainingJob (kubectl apply); "
            "it gets no pod and is deleted",
            job,
            extra={"job": job},
        )
        await self.bus.publish(
            self.bus.subjects.job(job), JobDeleted(source=self.bus.source, job=job)
        )

    # -- submission ---------------------------------------------------------------------

    async def _finished(self, name: str, obj: dict[str, Any]) -> str | None:
        """The phase of a finished job (its status, or else its status record); None
        while it has not finished."""
        phase = _status(obj).get("phase")
        if phase in FINISHED:
            return str(phase)
        record = await self.records.read_job_status(name)
        phase = (record or {}).get("phase")
        return str(phase) if phase in FINISHED else None

    def _last_submitted(self, obj: dict[str, Any], uid: str) -> int | None:
        """The generation of TrainingJob ``obj`` last submitted: its status's
        ``submittedGeneration`` or the one this process submitted, the later; None if
        neither says."""
        submitted = _status(obj).get("submittedGeneration")
        if not isinstance(submitted, int) or isinstance(submitted, bool):
            submitted = None
        if uid in self._submitted:
            submitted = max(submitted or 0, self._submitted[uid])
        return submitted

    async def _holds_finished(self, name: str, obj: dict[str, Any], generation: int) -> bool:
        """Whether job ``name`` has finished, so its new ``generation`` is not run
        (logged once per generation)."""
        finished = await self._finished(name, obj)
        if finished is None:
            return False
        if (name, generation) not in self._held:
            self._held.add((name, generation))
            log.info(
                "TrainingJob %s is %s: generation %d is not run (delete and create "
                "it to run it again)",
                name,
                finished,
                generation,
                extra={"job": name},
            )
        return True

    def _document(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The job document TrainingJob ``obj`` submits (its spec as Kueue admits it,
        ``effective_spec``; its name and labels)."""
        meta = _meta(obj)
        spec = self.effective_spec(obj) if isinstance(obj.get("spec"), dict) else obj.get("spec")
        return {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "metadata": {
                "name": name_of(obj),
                "namespace": meta.get("namespace") or self.kube.namespace,
                "labels": meta.get("labels") or {},
            },
            "spec": spec,
        }

    async def _submit(self, obj: dict[str, Any]) -> None:
        name = self.job_of(obj)
        uid = str(_meta(obj).get("uid") or "")
        generation = generation_of(obj)
        submitted = self._last_submitted(obj, uid)
        if submitted is not None and submitted >= generation:
            return
        # A status with a phase but no generation submitted: an older resurge's, which
        # recorded what it submitted otherwise (a new object's status is empty).
        before = submitted is not None or bool(_status(obj).get("phase"))
        # An edit of a job submitted before is not run once the job has finished.
        if before and await self._holds_finished(name, obj, generation):
            return
        document = self._document(obj)
        try:
            job = parse_job(document)
        except JobSpecError as error:
            self._submitted[uid] = generation
            if before:  # a running job keeps running as it was: only the edit is refused
                log.warning(
                    "TrainingJob %s: edit refused, the job runs on unchanged: %s",
                    name,
                    error,
                    extra={"job": name},
                )
                await self.kube.update_training_job_status(
                    name, lambda _: {"submittedGeneration": generation}
                )
                await self.event(obj, "InvalidEdit", f"the edit is not applied: {error}")
                return
            log.warning("TrainingJob %s rejected: %s", name, error, extra={"job": name})
            await self._reject(name, generation, str(error))
            await self.event(obj, "InvalidSpec", str(error))
            return
        await self.bus.publish(
            self.bus.subjects.job(name),
            JobSubmitted(source=self.bus.source, job=name, spec=job, update=before),
        )
        self._submitted[uid] = generation
        await self.kube.update_training_job_status(
            name, lambda _: {"submittedGeneration": generation}
        )
        log.info("TrainingJob %s submitted (generation %d)", name, generation, extra={"job": name})
        if self._document(obj)["spec"] != document["spec"]:
            await self.resubmit(name)  # Kueue's admission changed while it was submitted

    async def resubmit(self, name: str) -> None:
        """Submit job ``name`` again as an ``update`` (its TrainingJob as last seen), where
        it was submitted and has not finished: Kueue's hold on it changed."""
        obj = self.known.get(name)
        if obj is None or _meta(obj).get("deletionTimestamp"):
            return
        uid = str(_meta(obj).get("uid") or "")
        if self._last_submitted(obj, uid) is None or await self._finished(name, obj):
            return  # its first submission carries the hold; a finished job stays so
        try:
            job = parse_job(self._document(obj))
        except JobSpecError:
            return  # refused when submitted: nothing runs
        await self.bus.publish(
            self.bus.subjects.job(name),
            JobSubmitted(source=self.bus.source, job=name, spec=job, update=True),
        )
        log.info(
            "TrainingJob %s submitted again as Kueue admits it: %s",
            name,
            "held" if job.spec.suspend else f"at most {job.spec.replicas.upper} replicas",
            extra={"job": name},
        )

    async def _reject(self, name: str, generation: int, message: str) -> None:
        await self.kube.update_training_job_status(
            name, lambda training_job: rejected_status(_status(training_job), generation, message)
        )

    # -- refusals -----------------------------------------------------------------------

    async def refused(self, training_job: dict[str, Any], what: str, message: str) -> None:
        """The API refused to create a ``what`` (Pod, Service) of the job: a Warning
        Event ``FailedCreate<what>`` and the ``PodsRefused`` condition, both carrying the
        API's message."""
        name = self.job_of(training_job)
        log.warning("%s of %s refused: %s", what, name, message, extra={"job": name})
        await self.event(training_job, f"FailedCreate{what}", message)
        refused = condition(PODS_REFUSED, True, f"FailedCreate{what}", message, 0)
        await self._set(name, refused)

    async def admitted(self, training_job: dict[str, Any]) -> None:
        """A pod of the job was created: ``PodsRefused`` False again, where it was True."""
        conditions = _status(training_job).get("conditions") or []
        if not any(
            isinstance(c, dict) and c.get("type") == PODS_REFUSED and c.get("status") == "True"
            for c in conditions
        ):
            return
        await self._set(
            self.job_of(training_job), condition(PODS_REFUSED, False, "PodCreated", "", 0)
        )

    async def _set(self, name: str, new: dict[str, Any]) -> None:
        def change(training_job: dict[str, Any]) -> dict[str, Any] | None:
            stamped = {**new, "observedGeneration": generation_of(training_job)}
            before = _status(training_job).get("conditions")
            after = with_condition(before, stamped)
            return None if after == before else {"conditions": after}

        await self.kube.update_training_job_status(name, change)

    async def event(
        self, training_job: dict[str, Any], reason: str, message: str, warning: bool = True
    ) -> None:
        """Record a Kubernetes Event on ``training_job`` (a failure to is logged only)."""
        from resurge.cluster.kubernetes.status import event

        try:
            await self.kube.call(
                f"record an Event on {self.job_of(training_job)}",
                self.kube.core.create_namespaced_event,
                namespace_of(training_job) or self.kube.namespace,
                event(training_job, reason, message, warning=warning),
                _preload_content=False,
            )
        except (BackendError, ApiException) as error:
            log.warning("could not record an Event: %r", error)
