"""A Kueue stand-in for the API emulator: Kueue's CRDs, and an admission controller that
follows Kueue's documented Workload lifecycle where resurge depends on it.

The CRDs (data/kueue/*.yaml) are Kueue's own, from github.com/kubernetes-sigs/kueue
(config/components/crd/bases, commit ff69552e79ad21652c36caa97038382e55625cf7, release
0.19 line), trimmed to their ``v1beta1`` version (served by every Kueue release; the
emulator serves one version per CRD) with the Workload's pod templates left open
(``x-kubernetes-preserve-unknown-fields``: Kueue declares the whole PodTemplateSpec);
their other fields, checks and CEL rules are as Kueue ships them.

``KueueStandIn`` admits as Kueue does (https://kueue.sigs.k8s.io/docs/concepts/workload/,
.../cluster_queue/, .../local_queue/, .../resource_flavor/):

- a Workload whose ``spec.queueName`` is a LocalQueue of its namespace is queued in that
  LocalQueue's ClusterQueue; Workloads that are neither admitted nor ``Finished`` are
  tried by priority (``spec.priority``, higher first), then creation (BestEffortFIFO:
  one that does not fit does not hold back those behind it);
- one fits when, for each resource its pod sets request (the containers' requests times
  ``count``), some flavor of the ClusterQueue's resource group that covers it, tried in
  order, has ``nominalQuota`` left after the Workloads admitted there; a resource no
  resource group covers never fits;
- admitted: ``status.admission`` (``clusterQueue``, per pod set ``flavors``,
  ``resourceUsage`` and ``count``) and the conditions ``QuotaReserved`` and ``Admitted``
  True (no admission checks);
- a ClusterQueue whose ``spec.stopPolicy`` is ``Hold`` or ``HoldAndDrain`` admits
  nothing new (what it admitted stays: ``HoldAndDrain``'s eviction is not done);
- a Workload ``Finished`` or deleted holds no quota, and the next ones are tried;
- preemption within the ClusterQueue (``spec.preemption.withinClusterQueue:
  LowerPriority``, https://kueue.sigs.k8s.io/docs/concepts/preemption/): a pending
  Workload that does not fit evicts admitted ones of strictly lower priority, lowest
  first, then the most recently admitted, until it would fit: each gets ``Evicted`` and
  ``Preempted`` True (reason ``InClusterQueue``), ``QuotaReserved`` and ``Admitted``
  False and no ``status.admission``, and waits to be admitted again like any other;
  :meth:`KueueStandIn.evict` does the same to one Workload.

It leaves out: cohorts and borrowing, fair sharing, preemption beyond the above (within
a cohort, ``borrowWithinCohort``, ``LowerOrNewerEqualPriority``; and Kueue waits for an
evicted job to stop before it releases the quota, which here is released at once),
partial admission (``minCount``), admission checks, waitForPodsReady, requeueing
backoff, StrictFIFO, LimitRanges and pod overhead, topology-aware scheduling,
``spec.active``, ``namespaceSelector`` and resource flavors' taints.
It runs on the emulator's event loop and writes through the emulator's own methods, so
each admission is one atomic write, as the Workload status update of Kueue's scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from tests.kubernetes.emulator import ClusterEmulator, _Watcher

__all__ = ["CRDS", "KueueStandIn", "kueue_crds", "quantity"]

CRDS = Path(__file__).parent / "data" / "kueue"
GROUP = "kueue.x-k8s.io"
_SUFFIXES = {
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}


# A ClusterQueue's stopPolicy that admits nothing new.
_STOPPED = ("Hold", "HoldAndDrain")


def kueue_crds() -> list[dict[str, Any]]:
    """Kueue's CRDs (trimmed, see the module doc): Workload, ClusterQueue, LocalQueue,
    ResourceFlavor, WorkloadPriorityClass."""
    return [yaml.safe_load(path.read_text()) for path in sorted(CRDS.glob("*.yaml"))]


def quantity(text: object) -> Decimal:
    """A Kubernetes quantity ("2", "500m", "64Gi") as a number."""
    value = str(text)
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if value.endswith(suffix):
            return Decimal(value[: -len(suffix)]) * _SUFFIXES[suffix]
    return Decimal(value)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _true(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _requests(podset: dict[str, Any]) -> dict[str, Decimal]:
    """What one pod set requests in all: its containers' requests times its count."""
    total: dict[str, Decimal] = {}
    spec = (podset.get("template") or {}).get("spec") or {}
    for container in spec.get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, Decimal(0)) + quantity(value)
    return {name: value * int(podset.get("count") or 0) for name, value in total.items()}


def _text(value: Decimal) -> str:
    return str(int(value)) if value == value.to_integral_value() else f"{int(value * 1000)}m"


class KueueStandIn:
    """The module doc's admission controller over ``emulator``; :meth:`schedule` is one
    pass, :meth:`run` a pass after each change of a Workload, ClusterQueue, LocalQueue
    or ResourceFlavor."""

    def __init__(self, emulator: ClusterEmulator) -> None:
        self.emulator = emulator

    async def run(self) -> None:
        """A pass now and after each change, until cancelled."""
        kinds = [self.emulator.kind(k) for k in ("workloads", "clusterqueues", "localqueues")]
        watchers = [_Watcher(kind.key) for kind in kinds]
        woken = asyncio.Event()
        for watcher in watchers:
            self.emulator._watchers.add(watcher)
        try:
            self.schedule()
            while True:
                waits = [asyncio.ensure_future(w.queue.get()) for w in watchers]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for wait in waits:
                        wait.cancel()
                for watcher in watchers:  # take every change queued: one pass for all
                    while not watcher.queue.empty():
                        watcher.queue.get_nowait()
                woken.clear()
                self.schedule()
        finally:
            for watcher in watchers:
                self.emulator._watchers.discard(watcher)

    def _workloads(self) -> list[dict[str, Any]]:
        return self.emulator.current("workloads")

    def _cluster_queue_of(self, workload: dict[str, Any]) -> str | None:
        namespace = workload["metadata"].get("namespace")
        for queue in self.emulator.current("localqueues", namespace):
            if queue["metadata"]["name"] == (workload.get("spec") or {}).get("queueName"):
                return str((queue.get("spec") or {}).get("clusterQueue") or "") or None
        return None

    def _usage(
        self,
        cluster_queue: str,
        without: AbstractSet[str] = frozenset(),
    ) -> dict[tuple[str, str], Decimal]:
        """(flavor, resource) -> what the admitted, unfinished Workloads there hold
        (but those whose uid is in ``without``)."""
        used: dict[tuple[str, str], Decimal] = {}
        for workload in self._workloads():
            if workload["metadata"]["uid"] in without:
                continue
            admission = (workload.get("status") or {}).get("admission") or {}
            if admission.get("clusterQueue") != cluster_queue or _true(workload, "Finished"):
                continue
            for assignment in admission.get("podSetAssignments") or []:
                flavors = assignment.get("flavors") or {}
                for name, value in (assignment.get("resourceUsage") or {}).items():
                    key = (str(flavors.get(name)), name)
                    used[key] = used.get(key, Decimal(0)) + quantity(value)
        return used

    def _assign(
        self,
        cluster_queue: dict[str, Any],
        wanted: dict[str, Decimal],
        without: AbstractSet[str] = frozenset(),
    ) -> dict[str, str] | None:
        """resource -> flavor where ``wanted`` fits in ``cluster_queue`` now (the
        Workloads whose uid is in ``without`` gone); None if not."""
        used = self._usage(cluster_queue["metadata"]["name"], without)
        chosen: dict[str, str] = {}
        groups = (cluster_queue.get("spec") or {}).get("resourceGroups") or []
        for name, amount in wanted.items():
            group = next((g for g in groups if name in (g.get("coveredResources") or [])), None)
            if group is None:
                return None
            for flavor in group.get("flavors") or []:
                quota = next(
                    (r for r in flavor.get("resources") or [] if r.get("name") == name), None
                )
                if quota is None:
                    continue
                left = quantity(quota["nominalQuota"]) - used.get((flavor["name"], name), 0)
                if amount <= left:
                    chosen[name] = flavor["name"]
                    break
            else:
                return None
        return chosen

    def schedule(self) -> None:
        """One pass: admit every pending Workload that fits, in queue order."""
        pending = [
            w
            for w in self._workloads()
            if not (w.get("status") or {}).get("admission") and not _true(w, "Finished")
        ]
        pending.sort(
            key=lambda w: (
                -int((w.get("spec") or {}).get("priority") or 0),
                w["metadata"]["creationTimestamp"],
                int(w["metadata"]["resourceVersion"]),
            )
        )
        for workload in pending:
            queue_name = self._cluster_queue_of(workload)
            if queue_name is None:
                continue
            with contextlib.suppress(Exception):
                cluster_queue = self.emulator.get_object("clusterqueues", queue_name)
                if (cluster_queue.get("spec") or {}).get("stopPolicy") in _STOPPED:
                    continue
                if not self._try_admit(workload, cluster_queue):
                    self._preempt_for(workload, cluster_queue)

    def _preempt_for(self, workload: dict[str, Any], cluster_queue: dict[str, Any]) -> None:
        """Evict lower-priority Workloads of ``cluster_queue`` until ``workload`` fits."""
        policy = (cluster_queue.get("spec") or {}).get("preemption") or {}
        if policy.get("withinClusterQueue") != "LowerPriority":
            return
        priority = int((workload.get("spec") or {}).get("priority") or 0)
        name = cluster_queue["metadata"]["name"]
        victims = [
            w
            for w in self._workloads()
            if ((w.get("status") or {}).get("admission") or {}).get("clusterQueue") == name
            and not _true(w, "Finished")
            and int((w.get("spec") or {}).get("priority") or 0) < priority
        ]
        victims.sort(
            key=lambda w: (
                int((w.get("spec") or {}).get("priority") or 0),
                -int(w["metadata"]["resourceVersion"]),
            )
        )
        wanted = [_requests(p) for p in workload["spec"]["podSets"]]
        chosen: list[dict[str, Any]] = []
        for victim in victims:
            chosen.append(victim)
            freed = {v["metadata"]["uid"] for v in chosen}
            if all(self._assign(cluster_queue, w, without=freed) is not None for w in wanted):
                for evicted in chosen:
                    self.evict(evicted["metadata"]["name"], evicted["metadata"]["namespace"])
                return

    def evict(self, name: str, namespace: str = "default", reason: str = "InClusterQueue") -> None:
        """Evict Workload ``name`` as Kueue's preemption does (the module doc)."""
        workload = self.emulator.get_object("workloads", name, namespace)
        stamp = _now()
        kept = [
            c
            for c in (workload.get("status") or {}).get("conditions") or []
            if c.get("type") not in ("QuotaReserved", "Admitted", "Evicted", "Preempted")
        ]
        message = "Preempted to accommodate a workload of higher priority"

        def condition(kind: str, status: str, why: str) -> dict[str, Any]:
            return {
                "type": kind,
                "status": status,
                "reason": why,
                "message": message,
                "lastTransitionTime": stamp,
            }

        status = {
            "admission": None,
            "conditions": [
                *kept,
                condition("Evicted", "True", "Preempted"),
                condition("Preempted", "True", reason),
                condition("QuotaReserved", "False", "Preempted"),
                condition("Admitted", "False", "NoReservation"),
            ],
        }
        self.emulator.patch_object(
            "workloads",
            name,
            {
                "metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]},
                "status": status,
            },
            namespace,
            subresource="status",
        )

    def _try_admit(self, workload: dict[str, Any], cluster_queue: dict[str, Any]) -> bool:
        """Admit ``workload`` where it fits now; whether it did."""
        assignments = []
        for podset in workload["spec"]["podSets"]:
            wanted = _requests(podset)
            flavors = self._assign(cluster_queue, wanted)
            if flavors is None:
                return False
            assignments.append(
                {
                    "name": podset["name"],
                    "flavors": flavors,
                    "resourceUsage": {name: _text(v) for name, v in wanted.items()},
                    "count": podset["count"],
                }
            )
        stamp = _now()
        name = cluster_queue["metadata"]["name"]
        conditions = [
            c
            for c in (workload.get("status") or {}).get("conditions") or []
            if c.get("type") not in ("QuotaReserved", "Admitted")
        ]
        conditions += [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "QuotaReserved",
                "message": f"Quota reserved in ClusterQueue {name}",
                "lastTransitionTime": stamp,
            },
            {
                "type": "Admitted",
                "status": "True",
                "reason": "Admitted",
                "message": "The workload is admitted",
                "lastTransitionTime": stamp,
            },
        ]
        status = {
            "admission": {"clusterQueue": name, "podSetAssignments": assignments},
            "conditions": conditions,
        }
        self.emulator.patch_object(
            "workloads",
            workload["metadata"]["name"],
            {
                "metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]},
                "status": status,
            },
            workload["metadata"]["namespace"],
            subresource="status",
        )
        return True

    def admitted(self) -> Iterator[str]:
        """The names of the Workloads admitted now."""
        for workload in self._workloads():
            if _true(workload, "Admitted"):
                yield workload["metadata"]["name"]


@contextlib.contextmanager
def running_kueue(api: Any) -> Iterator[KueueStandIn]:
    """Kueue's CRDs registered on ``api`` (a conftest ``KubeApi``) and the stand-in
    running on its loop until the block ends."""

    def start(emulator: ClusterEmulator) -> tuple[KueueStandIn, asyncio.Task[None]]:
        for crd in kueue_crds():
            emulator.register_crd(crd)
        stand_in = KueueStandIn(emulator)
        return stand_in, asyncio.get_running_loop().create_task(stand_in.run())

    stand_in, task = api.call(start)
    try:
        yield stand_in
    finally:
        api.call(lambda _: task.cancel())
