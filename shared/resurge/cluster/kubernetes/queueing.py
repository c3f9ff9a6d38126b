"""The controller's side of Kueue: a queued TrainingJob (:func:`.kueue.queue_of`) is one
Kueue workload, and gets no pod before Kueue admits it.

- **Workloads.** A queued TrainingJob, when seen and before it is submitted, gets its
  base ``Workload`` (:func:`.kueue.workload_manifest`: one pod set of its ``min``
  replicas with its pods' requests; its WorkloadPriorityClass and that class's value),
  owned by the TrainingJob, so it goes with it. An elastic one gets its elastic
  Workload (the other ``max - min`` replicas) once the base is admitted
  (:mod:`.kueue`).
- **Run as admitted.** The job is submitted as Kueue admits it
  (:meth:`Queueing.effective_spec`): held (``spec.suspend``) while its base Workload
  is not admitted, so the scaler places nothing; else with ``replicas.max`` at most
  what is admitted (:func:`.kueue.allowed_replicas`). Each change of that is submitted
  again (an ``update``; the TrainingJob is not edited): admitted, the job starts (or
  resumes from its checkpoint); its base evicted (Kueue's preemption: ``Evicted``, the
  admission taken back), the scaler checkpoints and suspends it (back to Pending) until
  it is admitted again; its elastic part evicted, the scaler shrinks it to ``min``
  (checkpoint first), and grows it back once that is admitted again.
- **No pod before admission.** A replica gets its pod only while it is within the
  replicas admitted; then the pod is made from the TrainingJob with the admitted
  ResourceFlavors' ``nodeLabels`` in its template's ``nodeSelector``.
- **Events.** A job first seen not admitted is a ``WaitingForKueue`` Event on its
  TrainingJob; each change between none of it admitted and some is an
  ``AdmittedByKueue`` or ``WaitingForKueue`` one.
- **Admission followed.** Workloads are watched (from the first queued job on, so an
  install without Kueue never asks for them); a change of a job's admission calls
  ``on_admission(job)``, which submits it again and reconciles its pods.
- **Finished.** A queued job whose TrainingJob reaches Succeeded or Failed marks its
  Workloads ``Finished`` (as Kueue's job framework does), which releases its quota.

Not done: partial admission (``minCount``) and workload slices: the elastic part is
admitted, and preempted, whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from resurge.cluster.kubernetes.api import MERGE_PATCH, KubeApi, conflict
from resurge.cluster.kubernetes.identity import bus_name
from resurge.cluster.kubernetes.jobs import namespace_of
from resurge.cluster.kubernetes.kueue import (
    BASE,
    ELASTIC,
    FINISHED,
    KUEUE_GROUP,
    KUEUE_VERSION,
    Admission,
    admission_of,
    allowed_replicas,
    finished_condition,
    flavor_node_labels,
    part_of,
    priority_class_of,
    queue_of,
    replica_bounds,
    with_node_labels,
    workload_manifest,
    workload_name,
)
from resurge.cluster.kubernetes.times import now_time
from resurge.cluster.kubernetes.watch import SYNCED, follow
from resurge.cluster.protocol import BackendError, WorkerGroupSpec

if TYPE_CHECKING:
    from resurge.cluster.kubernetes.jobs import TrainingJobs

__all__ = ["NoKueue", "Queueing"]

log = logging.getLogger("resurge.cluster.kubernetes")

_FINISHED_PHASES = ("Succeeded", "Failed")
WORKLOADS = "workloads"
RESOURCE_FLAVORS = "resourceflavors"
PRIORITY_CLASSES = "workloadpriorityclasses"


class NoKueue(Exception):
    """A queued job's Workload cannot be created: the API has no Kueue Workloads."""


class Queueing:
    """The module docstring's Kueue side, for the controller's ``kube`` and ``jobs``."""

    def __init__(
        self,
        kube: KubeApi,
        jobs: TrainingJobs,
        on_admission: Callable[[str], Awaitable[None]],
        pod_of: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        self.kube = kube
        self.jobs = jobs
        self.on_admission = on_admission
        self.pod_of = pod_of  # a pod of the TrainingJob, for its requests
        # bus name -> part (BASE, ELASTIC) -> its Workload as last seen
        self.workloads: dict[str, dict[str, dict[str, Any]]] = {}
        self._told: dict[str, bool] = {}  # bus name -> admitted, as last told in an Event
        self._watch: asyncio.Task[None] | None = None

    @staticmethod
    def queued(training_job: dict[str, Any]) -> bool:
        """Whether ``training_job`` goes through Kueue (it has a queue)."""
        return queue_of(training_job) is not None

    def allowed(self, training_job: dict[str, Any]) -> int:
        """How many replicas Kueue lets queued ``training_job`` run, by its Workloads as
        last seen (:func:`.kueue.allowed_replicas`)."""
        parts = self.workloads.get(self.jobs.job_of(training_job)) or {}
        base, elastic = (parts.get(p) for p in (BASE, ELASTIC))
        return allowed_replicas(
            admission_of(base) if base is not None else None,
            admission_of(elastic) if elastic is not None else None,
            replica_bounds(training_job),
        )

    def effective_spec(self, training_job: dict[str, Any]) -> dict[str, Any]:
        """The spec ``training_job`` is submitted with: as written, or, where it is
        queued, held while Kueue admits none of it, else with ``replicas.max`` (and any
        ``discrete`` sizes) at most what Kueue admits (the module docstring)."""
        spec = dict(training_job.get("spec") or {})
        if not self.queued(training_job):
            return spec
        allowed = self.allowed(training_job)
        if allowed == 0:
            return {**spec, "suspend": True}
        low, high = replica_bounds(training_job)
        if allowed >= high:
            return spec
        replicas = {**(spec.get("replicas") or {}), "max": max(low, allowed)}
        if isinstance(replicas.get("discrete"), list):
            replicas["discrete"] = [n for n in replicas["discrete"] if n <= replicas["max"]]
        return {**spec, "replicas": replicas}

    # -- the gate -------------------------------------------------------------------------

    async def admitted_job(
        self,
        spec: WorkerGroupSpec,
        training_job: dict[str, Any],
        pod: dict[str, Any],
        rank: int,
    ) -> dict[str, Any] | None:
        """The TrainingJob to make the pod of ``spec`` from (with the admitted flavors'
        node labels), or None: Kueue has not admitted it (yet). ``pod`` is the pod as it
        would be made, whose requests the Workload asks for, where there is none yet;
        ``rank`` the place of ``spec.replica`` among the job's replicas (their indexes
        need not be 0 to n-1 after a resize)."""
        self._start_watch()
        job = spec.job
        parts = self.workloads.setdefault(job, {})
        if BASE not in parts:
            parts[BASE] = await self._ensure_workload(training_job, pod, BASE)
        # What is allowed and the admission whose flavors the pod takes are read at one
        # moment: the watch may replace a Workload while this awaits (even by an older
        # event than the one just read), and a pod made from a not-yet-admitted copy
        # would get none of the flavor's node labels.
        allowed = self.allowed(training_job)
        admitted = rank < allowed
        low = replica_bounds(training_job)[0]
        workload = parts[BASE] if rank < low else parts.get(ELASTIC, parts[BASE])
        admission = admission_of(workload)
        await self._tell(training_job, job, allowed > 0)
        if not admitted or not admission.admitted:
            log.info(
                "no pod for %s replica %d: Kueue has not admitted it",
                job,
                spec.replica,
                extra={"job": job},
            )
            return None
        labels = flavor_node_labels(await self._flavors(admission))
        return with_node_labels(training_job, labels)

    async def _tell(self, training_job: dict[str, Any], job: str, admitted: bool) -> None:
        if self._told.get(job) == admitted or (job not in self._told and admitted):
            self._told[job] = admitted
            return
        self._told[job] = admitted
        if admitted:
            reason, message = "AdmittedByKueue", "Kueue admitted the workload; pods are made"
        else:
            reason = "WaitingForKueue"
            message = f"no pod until Kueue admits the Workload {workload_name(training_job)}"
        await self.jobs.event(training_job, reason, message, warning=False)

    async def _ensure_workload(
        self, training_job: dict[str, Any], pod: dict[str, Any], part: str
    ) -> dict[str, Any]:
        """The job's Workload ``part`` as read, created first where there is none."""
        namespace, name = namespace_of(training_job), workload_name(training_job, part)
        found = await self._read_workload(namespace, name)
        if found is not None:
            return found
        priority = await self._priority(training_job)
        low, high = replica_bounds(training_job)
        count = low if part == BASE else high - low
        manifest = workload_manifest(training_job, pod, count, priority, part)
        try:
            created = await self.kube.read(
                f"create Workload {namespace}/{name}",
                self.kube.custom.create_namespaced_custom_object,
                KUEUE_GROUP,
                KUEUE_VERSION,
                namespace,
                WORKLOADS,
                manifest,
            )
        except BackendError as error:
            if not conflict(error):
                raise
            created = await self._read_workload(namespace, name)
        if created is None:  # 404: no such resource
            raise NoKueue(
                f"the job is queued ({queue_of(training_job)}) but this cluster has no Kueue "
                f"Workloads ({KUEUE_GROUP}/{KUEUE_VERSION}): install Kueue, or remove the "
                "queue (the label kueue.x-k8s.io/queue-name, spec.queue)"
            )
        log.info(
            "created the Kueue Workload %s/%s of %s",
            namespace,
            name,
            self.jobs.job_of(training_job),
        )
        return created

    async def _read_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.kube.read(
            f"read Workload {namespace}/{name}",
            self.kube.custom.get_namespaced_custom_object,
            KUEUE_GROUP,
            KUEUE_VERSION,
            namespace,
            WORKLOADS,
            name,
        )

    async def _priority(self, training_job: dict[str, Any]) -> int | None:
        """The value of the job's WorkloadPriorityClass; None where it names none, or
        one that does not exist (logged: the Workload then has Kueue's default)."""
        name = priority_class_of(training_job)
        if name is None:
            return None
        found = await self.kube.read(
            f"read WorkloadPriorityClass {name}",
            self.kube.custom.get_cluster_custom_object,
            KUEUE_GROUP,
            KUEUE_VERSION,
            PRIORITY_CLASSES,
            name,
        )
        if found is None:
            log.warning("WorkloadPriorityClass %s does not exist: the job has none", name)
            return None
        return int(found.get("value") or 0)

    async def _flavors(self, admission: Admission) -> list[dict[str, Any]]:
        flavors = []
        for name in admission.flavors:
            flavor = await self.kube.read(
                f"read ResourceFlavor {name}",
                self.kube.custom.get_cluster_custom_object,
                KUEUE_GROUP,
                KUEUE_VERSION,
                RESOURCE_FLAVORS,
                name,
            )
            if flavor is not None:
                flavors.append(flavor)
        return flavors

    # -- following admission --------------------------------------------------------------

    def _start_watch(self) -> None:
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        """Stop following Workloads."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch

    async def _follow(self) -> None:
        """Keep ``workloads`` current; a job whose admission changed is reconciled."""
        changes = follow(
            self.kube.custom.list_cluster_custom_object,
            group=KUEUE_GROUP,
            version=KUEUE_VERSION,
            plural=WORKLOADS,
        )
        async with contextlib.aclosing(changes) as stream:
            async for kind, workload in stream:
                if kind == SYNCED:
                    continue
                job = self._job_of(workload)
                if job is None:
                    continue
                parts = self.workloads.setdefault(job, {})
                part = part_of(workload)
                before = parts.get(part)
                if kind == "DELETED":
                    parts.pop(part, None)
                else:
                    parts[part] = workload
                was = admission_of(before) if before is not None else None
                now = admission_of(workload) if kind != "DELETED" else None
                if was == now:
                    continue
                try:
                    await self._elastic_part(job)
                    training_job = self.jobs.known.get(job)
                    if training_job is not None:
                        await self._tell(training_job, job, self.allowed(training_job) > 0)
                    await self.on_admission(job)
                except Exception:
                    log.exception("could not act on the admission of %s", job)

    async def _elastic_part(self, job: str) -> None:
        """Create the elastic Workload of elastic ``job`` once its base is admitted."""
        training_job = self.jobs.known.get(job)
        parts = self.workloads.get(job) or {}
        if training_job is None or ELASTIC in parts or BASE not in parts:
            return
        low, high = replica_bounds(training_job)
        if high > low and admission_of(parts[BASE]).admitted:
            made = await self._ensure_workload(training_job, self.pod_of(training_job), ELASTIC)
            parts.setdefault(ELASTIC, made)

    def _job_of(self, workload: dict[str, Any]) -> str | None:
        """The bus name of the TrainingJob that owns ``workload``; None: none does."""
        for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
            if isinstance(ref, dict) and ref.get("kind") == "TrainingJob":
                namespace = namespace_of(workload) or self.kube.namespace
                return bus_name(namespace, str(ref.get("name")), self.kube.namespace)
        return None

    # -- finishing ------------------------------------------------------------------------

    async def on_training_job(self, training_job: dict[str, Any]) -> None:
        """A TrainingJob as seen: if it is queued, its Workload is made where there is
        none; if it has finished, its Workload is marked ``Finished`` (its quota
        released)."""
        if not self.queued(training_job):
            return
        phase = (training_job.get("status") or {}).get("phase")
        if phase not in _FINISHED_PHASES:
            job = self.jobs.job_of(training_job)
            parts = self.workloads.setdefault(job, {})
            if BASE not in parts and not (training_job.get("metadata") or {}).get(
                "deletionTimestamp"
            ):
                self._start_watch()
                pod = self.pod_of(training_job)
                parts.setdefault(BASE, await self._ensure_workload(training_job, pod, BASE))
                await self._elastic_part(job)
                await self._tell(training_job, job, self.allowed(training_job) > 0)
            return
        for part in (BASE, ELASTIC):
            await self._finish(training_job, str(phase), part)

    async def _finish(self, training_job: dict[str, Any], phase: str, part: str) -> None:
        """Mark the job's Workload ``part`` ``Finished`` (where it exists)."""
        namespace, name = namespace_of(training_job), workload_name(training_job, part)
        for _ in range(5):
            workload = await self._read_workload(namespace, name)
            if workload is None or admission_of(workload).finished:
                return
            status = workload.get("status") or {}
            kept = [c for c in status.get("conditions") or [] if c.get("type") != FINISHED]
            message = str((training_job.get("status") or {}).get("message") or "")
            done = finished_condition(phase, message, now_time())
            body = {
                "metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]},
                "status": {"conditions": [*kept, done]},
            }
            try:
                await self.kube.read(
                    f"finish Workload {namespace}/{name}",
                    self.kube.custom.patch_namespaced_custom_object_status,
                    KUEUE_GROUP,
                    KUEUE_VERSION,
                    namespace,
                    WORKLOADS,
                    name,
                    body,
                    _content_type=MERGE_PATCH,
                )
            except BackendError as error:
                if conflict(error):
                    continue
                raise
            log.info("Workload %s/%s finished: %s", namespace, name, phase)
            return
