"""The scaler's metrics: resizes, each job's replicas, and the cluster's GPUs.

- ``resurge_resizes_total{kind}``: resizes written, by kind (grow, shrink, suspend);
- ``resurge_job_replicas{job}`` and ``resurge_job_target_replicas{job}``: the replicas
  each unfinished job runs with and the replicas it is meant to run with (as in
  ``resurge status``);
- ``resurge_gpus_in_use`` and ``resurge_gpus_idle``: slots of the healthy live nodes
  in use (:mod:`resurge.control.views.cluster_snapshot`: replicas, held spares, worker groups,
  claimed placements), and free.

Label bounds: ``kind`` is a ResizeKind (a closed enum); ``job`` is bounded by the
unfinished jobs: a job's series go when it finishes or its record is deleted.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from resurge.control.state.records import JobRecord, status_view
from resurge.control.views.cluster_snapshot import ClusterSnapshot

__all__ = ["RESIZE_KINDS", "ScalerMetrics"]

RESIZE_KINDS = ("grow", "shrink", "suspend")
"""The resizes the scaler writes for the restarter to carry out."""


class ScalerMetrics:
    """The scaler's metrics in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.resizes = Counter(
            "resurge_resizes_total",
            "Resizes written for the restarter to carry out, by kind.",
            ["kind"],
            registry=registry,
        )
        for kind in RESIZE_KINDS:
            self.resizes.labels(kind)
        self.replicas = Gauge(
            "resurge_job_replicas",
            "Replicas the job runs with now (unfinished jobs).",
            ["job"],
            registry=registry,
        )
        self.target = Gauge(
            "resurge_job_target_replicas",
            "Replicas the job is meant to run with (unfinished jobs).",
            ["job"],
            registry=registry,
        )
        self.in_use = Gauge(
            "resurge_gpus_in_use",
            "GPU slots of healthy live nodes in use (replicas, held spares, placements, "
            "other pods).",
            registry=registry,
        )
        self.idle = Gauge(
            "resurge_gpus_idle",
            "GPU slots of healthy live nodes not in use.",
            registry=registry,
        )
        self._jobs: set[str] = set()

    def resized(self, kind: str) -> None:
        """Count one resize of ``kind``."""
        self.resizes.labels(kind).inc()

    def job_seen(self, name: str, record: JobRecord | None) -> None:
        """Set ``name``'s replica gauges from its record; None (deleted) or a finished
        record removes them."""
        if record is None or record.phase.finished:
            if name in self._jobs:
                self._jobs.discard(name)
                self.replicas.remove(name)
                self.target.remove(name)
            return
        replicas = status_view(record)["replicas"]
        assert isinstance(replicas, dict)
        self.replicas.labels(name).set(replicas["current"])
        self.target.labels(name).set(replicas["target"])
        self._jobs.add(name)

    def gpus(self, snapshot: ClusterSnapshot) -> None:
        """Set the GPU gauges from the cluster snapshot: slots of its healthy live nodes
        in use (by replicas, held spares, worker groups, claims and pods resurge did not
        create) and free."""
        slots = {node.name: node.slots for node in snapshot.nodes if node.healthy}
        used = snapshot.used()
        in_use = sum(min(used.get(name, 0), total) for name, total in slots.items())
        self.in_use.set(in_use)
        self.idle.set(sum(slots.values()) - in_use)
