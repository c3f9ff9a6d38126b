"""The Kubernetes controller: TrainingJobs in, pods and Services out, node capacity told.

Run by the scaler (:meth:`~.backend.KubernetesBackend.reconcile`) until cancelled; three loops,
each over a watch that resumes and relists (:mod:`.watch`):

- **TrainingJobs** of the served namespaces (:mod:`.scope`: every one, or those of
  ``RESURGE_KUBE_NAMESPACES``) become job submissions and deletions on the bus
  (:mod:`.jobs`); a job's pods and Service are made in its TrainingJob's namespace.
- **Pods** are kept in line with the worker-group records: each record has exactly one
  pod carrying its spec (:func:`~.objects.pod_manifest`); a pod whose spec
  is not its record's (a new incarnation, another node) or whose record is gone is
  deleted, and a record without its pod gets one, so a pod deleted behind resurge's
  back, or evicted (phase Failed), comes back; but not when the job's TrainingJob is
  gone or going (its pods were garbage-collected with it, and the scaler is about to
  delete the records). Each job with a record has its headless Service. A pod the
  scheduler cannot place is a ``PodUnschedulable`` Warning Event on its TrainingJob.
  With ``RESURGE_KUBE_DISRUPTION_BUDGETS`` (the default), each job also has a
  PodDisruptionBudget (:mod:`.disruption`) that allows no eviction of its pods: made
  with its first pod, its ``minAvailable`` raised to the job's count of worker groups
  before a pod is made beyond it, deleted with the Service.
- **Nodes**: a change of a Node's readiness, schedulability or slots is published as
  ``CapacityChanged``, as the node monitors publish theirs, so a node turning NotReady
  is acted on without waiting for its monitor to fall silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from resurge.cluster.kubernetes.api import MERGE_PATCH, KubeApi, conflict
from resurge.cluster.kubernetes.disruption import budget_name, disruption_budget
from resurge.cluster.kubernetes.identity import local_name
from resurge.cluster.kubernetes.informer import informer
from resurge.cluster.kubernetes.jobs import TrainingJobs, name_of, namespace_of
from resurge.cluster.kubernetes.objects import (
    DEMAND_LABEL,
    JOB_LABEL,
    group_of_pod,
    job_service,
    node_info,
    node_ready,
    owner_reference,
    pod_manifest,
    pod_name,
)
from resurge.cluster.kubernetes.pod_credentials import (
    PodUsers,
    issued_of,
    secret_manifest,
    secret_name,
    stale,
)
from resurge.cluster.kubernetes.queueing import NoKueue, Queueing
from resurge.cluster.kubernetes.renewal import serve_renewals, sweep_seconds
from resurge.cluster.kubernetes.scope import Served
from resurge.cluster.kubernetes.watch import SYNCED, drain, raise_if_cancelled
from resurge.cluster.local.watch import watch_changes
from resurge.cluster.names import service_name
from resurge.cluster.protocol import BackendError, WorkerGroupSpec
from resurge.events import CapacityChanged
from resurge.jobspec.accelerator import job_accelerator
from resurge.runtime.together import together

if TYPE_CHECKING:
    from resurge.cluster.local.backend import LocalBackend
    from resurge.runtime.bus import Bus
    from resurge.runtime.settings import Settings

__all__ = ["Controller"]

log = logging.getLogger("resurge.cluster.kubernetes")

# Kueue's pod integration holds each pod of a queued workload behind a scheduling gate
# of this name until the workload is admitted.
KUEUE_GATE_PREFIX = "kueue.x-k8s.io/"

# A group's key: (job, replica).
Key = tuple[str, int]
# A pod's key: (namespace, name).
PodKey = tuple[str, str]

# A refused pod is tried again after this long, doubled each time up to the most.
_RETRY_FIRST_SECONDS = 1.0
_RETRY_MAX_SECONDS = 60.0
# The API's answers that refuse an object: every 4xx but 409 (it exists already).
_REFUSALS = frozenset(range(400, 500)) - {409}


class Refused(Exception):
    """The API refused to create a ``what`` (Pod, Service): Pod Security, a quota, a
    webhook, an invalid object; ``message`` is the API's."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(f"{what} refused: {message}")
        self.what = what
        self.message = message


def api_message(error: ApiException) -> str:
    """The message of the API's ``Status`` answer, else the HTTP reason."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        message = json.loads(error.body or "").get("message")
        if isinstance(message, str) and message:
            return message
    return f"{error.status} {error.reason}"


_name = name_of


class Controller:
    """The three loops of the module docstring: the cluster through ``kube``, the
    worker-group records in ``records``, submissions and capacity on ``bus``."""

    def __init__(
        self,
        kube: KubeApi,
        bus: Bus,
        records: LocalBackend,
        settings: Settings,
        pod_users: PodUsers | None = None,
    ) -> None:
        self.kube = kube
        self.bus = bus
        self.records = records
        self.settings = settings
        self.desired: dict[Key, WorkerGroupSpec] = {}
        self.pods: dict[PodKey, tuple[Key, WorkerGroupSpec, dict[str, Any]]] = {}
        self.deleting: set[PodKey] = set()
        self.services: set[str] = set()
        self.budgets: dict[str, int] = {}  # each job's budget's minAvailable, as written
        self.jobs = TrainingJobs(kube, bus, records)
        self.served = Served(kube)
        self.gated: set[str] = set()  # jobs with a pod Kueue has not admitted yet
        self.unschedulable: set[PodKey] = set()  # pods told to be unschedulable
        self.kueue = Queueing(kube, self.jobs, self._on_admission, self._template_pod)
        self.jobs.effective_spec = self.kueue.effective_spec
        self.issuer = pod_users  # each pod's own NATS user (.pod_credentials), if given
        self._backoff: dict[Key, float] = {}  # seconds before a refused pod is tried again
        self._queue: asyncio.Queue[tuple[str, Any]] | None = None

    async def run(self) -> None:
        """All three loops until cancelled."""
        if self.kueue.on_training_job not in self.jobs.observers:
            self.jobs.observers.append(self.kueue.on_training_job)
        try:
            # cancelled, it stops every loop before it ends
            await together(
                self.follow_jobs, self.follow_pods, self.follow_nodes, self.keep_credentials
            )
        finally:
            await self.kueue.stop()

    async def _on_admission(self, job: str) -> None:
        """Kueue's admission of ``job`` changed: submit it again (held or not, the
        scaler suspends or resumes it) and reconcile its pods (on the pod loop)."""
        await self.jobs.resubmit(job)
        if self._queue is not None:
            for key in [k for k in self.desired if k[0] == job]:
                self._queue.put_nowait(("retry", key))

    def _template_pod(self, training_job: dict[str, Any]) -> dict[str, Any]:
        """A pod of ``training_job`` as its replicas' would be, but on no node: what its
        Kueue Workload asks for."""
        spec = training_job.get("spec") or {}
        group = WorkerGroupSpec(
            job=self.jobs.job_of(training_job),
            replica=0,
            node="",
            nproc=int(spec.get("nprocPerNode") or 1),
            command=[str(c) for c in spec.get("command") or ["-"]],
        )
        return pod_manifest(group, training_job, {}, self.settings.kube_image)

    # -- TrainingJobs: :mod:`.jobs` ------------------------------------------------------

    async def follow_jobs(self) -> None:
        """The TrainingJob loop (:class:`~.jobs.TrainingJobs`), until cancelled."""
        await self.jobs.follow()

    async def _event(
        self, training_job: dict[str, Any], reason: str, message: str, warning: bool = True
    ) -> None:
        await self.jobs.event(training_job, reason, message, warning)

    # -- pods -----------------------------------------------------------------------------

    async def follow_pods(self) -> None:
        """Keep one pod per worker-group record (the module docstring), until cancelled.
        The records as they are and the pods as listed are both read before any pod is
        created or deleted."""
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._queue = queue
        synced = asyncio.Event()

        async def pods() -> None:
            async with contextlib.aclosing(self.served.pods(JOB_LABEL)) as changes:
                async for kind, obj in changes:
                    if kind == SYNCED:
                        synced.set()
                    else:
                        await queue.put((kind, obj))

        async def groups() -> None:
            await synced.wait()
            watched = watch_changes(None, None, self.records.groups, _none)
            async with contextlib.aclosing(watched) as changes:
                async for change in changes:
                    await queue.put(("group", change))

        for spec in await self.records.list_worker_groups():
            self.desired[(spec.job, spec.replica)] = spec
        async with contextlib.aclosing(drain(queue, [pods(), groups()])) as changes:
            async for kind, item in changes:
                await self._on_change(kind, item)
                raise_if_cancelled()

    async def _on_change(self, kind: str, item: Any) -> None:
        """One pod event or worker-group change: note Kueue's gate and a pod the
        scheduler cannot place, then reconcile."""
        if kind not in ("group", "DELETED", "retry"):
            await self._note_kueue(item)
            await self._note_unschedulable(item)
        elif kind == "DELETED":
            self.unschedulable.discard((namespace_of(item), _name(item)))
        for key in self._apply(kind, item):
            try:
                await self._reconcile(key)
            except Exception:
                log.exception("could not reconcile the pod of %s/%s", *key)

    def _apply(self, kind: str, item: Any) -> list[Key]:
        """Take one change into the controller's view; the groups it may have unsettled."""
        if kind == "retry":
            return [item]
        if kind == "group":
            key = (item.job, item.replica)
            if item.deleted:
                self.desired.pop(key, None)
            elif item.worker_group is not None:
                self.desired[key] = item.worker_group
            return [key]
        name = (namespace_of(item), _name(item))
        spec = group_of_pod(item)
        if kind == "DELETED":
            self.deleting.discard(name)
            gone = self.pods.pop(name, None)
            return [] if gone is None else [gone[0]]
        if spec is None:
            return []
        key = (spec.job, spec.replica)
        self.pods[name] = (key, spec, item)
        return [key]

    async def _note_unschedulable(self, pod: dict[str, Any]) -> None:
        """A worker-group pod the scheduler cannot place (``PodScheduled`` False,
        ``Unschedulable``: what resurge's placement does not weigh, such as cpu, memory
        or a required pod anti-affinity) is a ``PodUnschedulable`` Warning Event on its
        TrainingJob with the scheduler's words, once each time it becomes so."""
        spec = group_of_pod(pod)
        if spec is None:
            return
        key = (namespace_of(pod), _name(pod))
        conditions = (pod.get("status") or {}).get("conditions") or []
        scheduled: dict[str, Any] = next(
            (c for c in conditions if c.get("type") == "PodScheduled"), {}
        )
        if scheduled.get("status") != "False" or scheduled.get("reason") != "Unschedulable":
            self.unschedulable.discard(key)
            return
        if key in self.unschedulable:
            return
        self.unschedulable.add(key)
        training_job = self.jobs.known.get(spec.job)
        message = (
            f"pod {key[1]} (replica {spec.replica}, placed on {spec.node}) cannot be "
            f"scheduled: {scheduled.get('message') or 'no reason given'}"
        )
        log.warning("%s: %s", spec.job, message, extra={"job": spec.job})
        if training_job is not None:
            await self._event(training_job, "PodUnschedulable", message)

    async def _note_kueue(self, pod: dict[str, Any]) -> None:
        """Read Kueue's admission back: a job's pods wait behind Kueue's scheduling gate
        until its workload is admitted; the first gated pod and the gate's lifting are
        each an Event on the TrainingJob."""
        spec = group_of_pod(pod)
        if spec is None:
            return
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        gated = any(str(g.get("name", "")).startswith(KUEUE_GATE_PREFIX) for g in gates)
        if gated == (spec.job in self.gated):
            return
        training_job = self.jobs.known.get(spec.job)
        if gated:
            self.gated.add(spec.job)
            reason, message = "WaitingForKueue", "pods wait for Kueue to admit the workload"
        else:
            self.gated.discard(spec.job)
            reason, message = "AdmittedByKueue", "Kueue admitted the workload; pods schedule"
        log.info("%s: %s", spec.job, message, extra={"job": spec.job})
        if training_job is not None:
            await self._event(training_job, reason, message, warning=False)

    async def _reconcile(self, key: Key) -> None:
        wanted = self.desired.get(key)
        mine = [(name, spec, pod) for name, (k, spec, pod) in self.pods.items() if k == key]
        keep = False
        for name, spec, pod in mine:
            failed = (pod.get("status") or {}).get("phase") == "Failed"
            if wanted is not None and spec == wanted and not failed:
                keep = True
                continue
            if name not in self.deleting:
                self.deleting.add(name)
                await self._delete_pod(name)
        if wanted is not None and not keep and self._pod_key(wanted) not in self.pods:
            await self._create_pod(wanted)
        job = key[0]
        if not any(k[0] == job for k in self.desired):
            if job in self.services:
                await self._delete_service(job)
            if job in self.budgets:
                await self._delete_budget(job)

    def _pod_key(self, spec: WorkerGroupSpec) -> PodKey:
        """Where the pod of ``spec`` is: its TrainingJob's namespace, and its name."""
        return self.kube.locate(spec.job)[0], pod_name(spec)

    async def _create_pod(self, spec: WorkerGroupSpec) -> None:
        """The pod of ``spec`` (and its job's Service), only ever with its TrainingJob as
        owner, image and template: none where the TrainingJob is gone or going (one that
        never was: :meth:`~.jobs.TrainingJobs.no_training_job`). A refusal by the API is
        the job's ``PodsRefused`` condition and an Event, and is tried again later."""
        # Read now, not from the TrainingJob watch: the pods' watch may already show the
        # garbage collection of a deletion that watch has not delivered yet.
        training_job = await self.kube.training_job(spec.job)
        if training_job is None or (training_job.get("metadata") or {}).get("deletionTimestamp"):
            log.info(
                "no pod for %s replica %d: its TrainingJob is %s",
                spec.job,
                spec.replica,
                "gone" if training_job is None else "being deleted",
                extra={"job": spec.job},
            )
            if training_job is None:
                await self.jobs.no_training_job(spec.job)
            return
        key = (spec.job, spec.replica)
        try:
            if not await self._make_pod(spec, training_job):
                return  # Kueue has not admitted it: the admission reconciles it again
        except Refused as refusal:
            await self.jobs.refused(training_job, refusal.what, refusal.message)
            self._retry_later(key)
            return
        self._backoff.pop(key, None)
        await self.jobs.admitted(training_job)

    def _retry_later(self, key: Key) -> None:
        """Reconcile ``key`` again after a delay that doubles with each refusal."""
        delay = min(_RETRY_MAX_SECONDS, self._backoff.get(key, _RETRY_FIRST_SECONDS / 2) * 2)
        self._backoff[key] = delay
        if self._queue is not None:
            asyncio.get_running_loop().call_later(delay, self._queue.put_nowait, ("retry", key))

    async def _make_pod(self, spec: WorkerGroupSpec, training_job: dict[str, Any]) -> bool:
        """Create the pod of ``spec`` (and its job's Service); False where the job is
        queued and Kueue has not admitted the replica (:mod:`.queueing`)."""
        settings = self.settings
        accelerator = job_accelerator(training_job.get("spec"))
        if accelerator is not None and accelerator != settings.kube_accelerator:
            # Its slots would be counted in another resource than its pods request.
            raise Refused(
                "Pod",
                f"resurge creates no pod: the job's accelerator is {accelerator} (its "
                "spec.accelerator or template), but this installation counts nodes' slots "
                f"in {settings.kube_accelerator} (RESURGE_KUBE_ACCELERATOR)",
            )
        agent_env = {
            "RESURGE_NATS_URL": settings.nats_url,
            "RESURGE_NAMESPACE": settings.namespace,
            "RESURGE_CLUSTER": "kubernetes",
            "RESURGE_LOG_FORMAT": settings.log_format,
        }

        pod = self._pod_key(spec)

        def manifest_of(job: dict[str, Any]) -> dict[str, Any]:
            if self.issuer is not None:
                return pod_manifest(
                    spec, job, agent_env, settings.kube_image, creds_secret=secret_name(pod[1])
                )
            secret = settings.kube_agent_secret
            return pod_manifest(spec, job, agent_env, settings.kube_image, agent_secret=secret)

        manifest = manifest_of(training_job)
        if self.kueue.queued(training_job):
            try:
                replicas = sorted(r for j, r in self.desired if j == spec.job)
                rank = replicas.index(spec.replica) if spec.replica in replicas else 0
                admitted = await self.kueue.admitted_job(spec, training_job, manifest, rank)
            except NoKueue as error:
                raise Refused("Workload", str(error)) from error
            if admitted is None:
                return False
            manifest = manifest_of(admitted)
        if spec.job not in self.services:
            await self._create(
                "Service",
                self.kube.core.create_namespaced_service,
                job_service(local_name(spec.job), training_job),
                namespace_of(training_job),
            )
            self.services.add(spec.job)
        await self._keep_budget(spec.job, training_job)
        if self.issuer is not None:
            user = self.issuer.issue(spec, *pod)
            await self._put_secret(secret_manifest(*pod, user, training_job), pod[0])
        created = await self._create(
            "Pod", self.kube.core.create_namespaced_pod, manifest, namespace_of(training_job)
        )
        log.info(
            "%s pod %s for %s replica %d on %s",
            "created" if created else "found existing",
            manifest["metadata"]["name"],
            spec.job,
            spec.replica,
            spec.node,
            extra={"job": spec.job},
        )
        return True

    async def _keep_budget(self, job: str, training_job: dict[str, Any]) -> None:
        """Make ``job``'s PodDisruptionBudget (:mod:`.disruption`), or raise its
        ``minAvailable`` to the job's count of worker groups, before a pod of it is made.
        A budget the API refuses, or one of its name that is not this TrainingJob's, is a
        Warning Event and no more: the job runs without one."""
        if not self.settings.kube_disruption_budgets:
            return
        groups = sum(1 for k in self.desired if k[0] == job)
        if self.budgets.get(job, 0) >= groups:
            return  # a higher count than the groups only refuses more
        name = local_name(job)
        selector = {
            "matchLabels": {JOB_LABEL: name},
            "matchExpressions": [{"key": DEMAND_LABEL, "operator": "DoesNotExist"}],
        }
        owner = owner_reference(training_job)
        budget = disruption_budget(training_job, selector, groups, owner)
        namespace = namespace_of(training_job)
        what = f"PodDisruptionBudget {namespace}/{budget_name(training_job)}"
        try:
            if not await self._create(
                "PodDisruptionBudget",
                self.kube.policy.create_namespaced_pod_disruption_budget,
                budget,
                namespace,
            ):
                await self._raise_budget(what, budget, owner["uid"], namespace)
        except (Refused, BackendError) as error:
            message = f"{what} not made: {error}; the job runs without one"
            log.warning("%s: %s", job, message, extra={"job": job})
            await self._event(training_job, "DisruptionBudgetRefused", message)
            return
        self.budgets[job] = groups

    async def _raise_budget(
        self, what: str, budget: dict[str, Any], owner: str, namespace: str
    ) -> None:
        """Patch the ``minAvailable`` of the budget there already (made before this
        controller started, or before a grow) to ``budget``'s, if it is the job's."""
        name = budget["metadata"]["name"]
        found = await self.kube.read(
            f"read {what}",
            self.kube.policy.read_namespaced_pod_disruption_budget,
            name,
            namespace,
        )
        if found is None:
            raise BackendError(f"{what} was deleted meanwhile")  # made again with a pod
        owners = (found.get("metadata") or {}).get("ownerReferences") or []
        if not any(ref.get("uid") == owner for ref in owners):
            raise BackendError(f"{what} is there already and is not this TrainingJob's")
        await self.kube.read(
            f"patch {what}",
            self.kube.policy.patch_namespaced_pod_disruption_budget,
            name,
            namespace,
            {"spec": {"minAvailable": budget["spec"]["minAvailable"]}},
            _content_type=MERGE_PATCH,
        )

    async def _put_secret(self, secret: dict[str, Any], namespace: str) -> None:
        """Create ``secret``, or replace the one of that name (a pod made again)."""
        assert self.issuer is not None
        if await self._create("Secret", self.kube.core.create_namespaced_secret, secret, namespace):
            return
        name = secret["metadata"]["name"]
        await self.kube.call(
            f"replace Secret {namespace}/{name}",
            self.kube.core.replace_namespaced_secret,
            name,
            namespace,
            secret,
            _preload_content=False,
        )

    async def keep_credentials(self) -> None:
        """Where it issues pods' users: answer their agents' renewals and sweep their
        Secrets (:mod:`.renewal`) until cancelled."""
        if self.issuer is None:
            return
        subscription = await serve_renewals(self)
        try:
            while True:
                try:
                    await self.refresh_credentials()
                except Exception:
                    log.exception("renewing pods' NATS users failed; tried again")
                await asyncio.sleep(sweep_seconds(self.issuer.seconds))
        finally:
            await subscription.unsubscribe()

    async def refresh_credentials(self) -> None:
        """Give each pod's Secret a new JWT (same user key) where less than half of its
        time is left (:mod:`.pod_credentials`), so a container started again reads a
        valid one."""
        if self.issuer is None:
            return
        for (namespace, name), (_, spec, _) in list(self.pods.items()):
            if (namespace, name) not in self.deleting:
                await self.fresh_credentials(namespace, name, spec)

    async def fresh_credentials(
        self, namespace: str, pod: str, spec: WorkerGroupSpec
    ) -> tuple[str, str] | None:
        """(JWT, user public key) of pod ``namespace/pod``'s Secret, renewed first where
        it is stale; None where the pod has no readable Secret."""
        assert self.issuer is not None
        try:
            secret = await self.kube.read(
                f"read Secret {namespace}/{secret_name(pod)}",
                self.kube.core.read_namespaced_secret,
                secret_name(pod),
                namespace,
            )
        except BackendError as error:
            log.warning("cannot read the NATS user of pod %s/%s: %s", namespace, pod, error)
            return None
        user = None if secret is None else issued_of(secret)
        if user is None:
            return None
        if stale(user, self.issuer.seconds, time.time()):
            user = self.issuer.issue(spec, namespace, pod, seed=user.seed)
            training_job = await self.kube.training_job(spec.job)
            await self._put_secret(secret_manifest(namespace, pod, user, training_job), namespace)
        return user.jwt, user.user

    async def _create(self, what: str, fn: Any, body: dict[str, Any], namespace: str) -> bool:
        """Create ``body`` in ``namespace``; False if it already existed (409), which is
        not an error; :class:`Refused` where the API refuses it (any other 4xx)."""
        try:
            await self.kube.call(
                f"create {what} {namespace}/{body['metadata']['name']}",
                fn,
                namespace,
                body,
                _preload_content=False,
            )
        except (ApiException, BackendError) as error:
            cause = error.__cause__ if isinstance(error, BackendError) else error
            if isinstance(cause, ApiException) and cause.status in _REFUSALS:
                raise Refused(what, api_message(cause)) from error
            if not conflict(error):  # 409: it exists already
                raise
            return False
        return True

    async def _delete_pod(self, pod: PodKey) -> None:
        namespace, name = pod
        await self.kube.delete(
            f"delete pod {namespace}/{name}", self.kube.core.delete_namespaced_pod, name, namespace
        )
        if self.issuer is not None:
            secret = secret_name(name)
            await self.kube.delete(
                f"delete Secret {namespace}/{secret}",
                self.kube.core.delete_namespaced_secret,
                secret,
                namespace,
            )

    async def _delete_budget(self, job: str) -> None:
        self.budgets.pop(job, None)
        namespace, local = self.kube.locate(job)
        await self.kube.delete(
            f"delete PodDisruptionBudget {namespace}/{local}",
            self.kube.policy.delete_namespaced_pod_disruption_budget,
            local,
            namespace,
        )

    async def _delete_service(self, job: str) -> None:
        self.services.discard(job)
        namespace, local = self.kube.locate(job)
        name = service_name(local)
        await self.kube.delete(
            f"delete Service {namespace}/{name}",
            self.kube.core.delete_namespaced_service,
            name,
            namespace,
        )

    # -- nodes ----------------------------------------------------------------------------

    async def follow_nodes(self) -> None:
        """Publish CapacityChanged for each change of a Node's readiness, schedulability,
        slots or labels (a healthy node first seen is left to its monitor). The Nodes come
        from the process's one Node informer, which the backend's reads share."""
        told: dict[str, tuple[bool, int, dict[str, str]]] = {}
        async for kind, obj in informer(self.kube, self.kube.core.list_node).changes():
            if kind == SYNCED:
                continue
            name = _name(obj)
            if kind == "DELETED":
                told.pop(name, None)
                await self._capacity(name, 0, 0, False, {})
                raise_if_cancelled()
                continue
            info = node_info(obj, accelerator=self.settings.kube_accelerator)
            healthy = node_ready(obj) and info.schedulable
            state = (healthy, info.slots, info.labels)
            if told.get(name) == state:
                continue
            first = name not in told
            told[name] = state
            if first and healthy:
                continue  # a healthy node is announced by its monitor
            used = sum(s.nproc for s in self.desired.values() if s.node == name)
            free = max(0, info.slots - used) if healthy else 0
            await self._capacity(name, info.slots, free, healthy, info.labels)
            raise_if_cancelled()

    async def _capacity(
        self, node: str, total: int, free: int, healthy: bool, labels: dict[str, str]
    ) -> None:
        event = CapacityChanged(
            source=self.bus.source,
            node=node,
            slots_total=total,
            slots_free=free,
            healthy=healthy,
            labels=labels,
        )
        try:
            await self.bus.publish(self.bus.subjects.capacity(node), event)
        except Exception as error:
            log.warning("could not publish the capacity of %s: %r", node, error)


async def _none(name: str) -> None:
    return None
