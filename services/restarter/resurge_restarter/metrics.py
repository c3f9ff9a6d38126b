"""The restarter's metrics: restarts, recovery durations, and each job's goodput.

- ``resurge_restarts_total{level,reason}``: restarts decided, by recovery level and the
  fault's reason;
- ``resurge_recovery_duration_seconds{level}``: from a fault's detection to the new
  generation's first sign of life (the duration RecoveryFinished carries);
- ``resurge_job_goodput_ratio{job}``, ``resurge_job_lost_seconds_total{job,cause}`` and
  ``resurge_job_wall_seconds{job}``: each job's running goodput
  (:mod:`resurge.control.views.goodput_meter`), worked out at scrape time.

Label bounds: ``level`` is a RecoveryLevel (a closed enum); ``reason`` goes through a
:class:`~resurge.runtime.observability.BoundedLabel` (detector plugins choose their
own reasons); ``cause`` is one of the meter's four causes; ``job`` is bounded by the
jobs the meter keeps: live jobs and at most ``keep_finished`` finished ones, a job's
series going when its record is deleted or it is forgotten.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from resurge.contract.vocabulary import RecoveryLevel
from resurge.control.views.goodput_meter import GoodputMeter
from resurge.runtime.observability import BoundedLabel

__all__ = ["RECOVERY_BUCKETS", "GoodputCollector", "RestarterMetrics"]

# Recovery duration buckets (seconds): in-process and process restarts take about a
# second, a pod or node restart several, a job restart with a torch import tens.
RECOVERY_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

# Scrapes retried when the meter changed under one (it is fed on the event loop's
# thread, scraped on the metrics server's).
_COLLECT_TRIES = 5


class GoodputCollector(Collector):
    """Exposes a :class:`GoodputMeter`'s jobs at scrape time."""

    def __init__(self, meter: GoodputMeter) -> None:
        self.meter = meter

    def collect(self) -> Iterator[Metric]:
        """The goodput, lost seconds and wall seconds of every job the meter keeps."""
        for attempt in range(_COLLECT_TRIES):
            try:
                families = self._families(datetime.now(UTC))
            except RuntimeError:  # a job added or dropped while reading: read again
                if attempt == _COLLECT_TRIES - 1:
                    raise
                continue
            yield from families
            return

    def _families(self, now: datetime) -> list[Metric]:
        ratio = GaugeMetricFamily(
            "resurge_job_goodput_ratio",
            "Productive time over wall time of the job so far (0..1).",
            labels=["job"],
        )
        lost = CounterMetricFamily(
            "resurge_job_lost_seconds",
            "Seconds of the job's wall time lost, by cause.",
            labels=["job", "cause"],
        )
        wall = GaugeMetricFamily(
            "resurge_job_wall_seconds",
            "Seconds from the job's submission to now (or to its end).",
            labels=["job"],
        )
        for job, sums in list(self.meter.jobs.items()):
            goodput = sums.goodput(now)
            if goodput is not None:
                ratio.add_metric([job], goodput)
            for cause, seconds in sums.lost(now).items():
                lost.add_metric([job, cause], seconds)
            wall.add_metric([job], sums.wall(now))
        return [ratio, lost, wall]


class RestarterMetrics:
    """The restarter's counters and histograms in ``registry``, and its goodput meter."""

    def __init__(self, registry: CollectorRegistry, meter: GoodputMeter | None = None) -> None:
        self.restarts = Counter(
            "resurge_restarts_total",
            "Restarts decided, by recovery level and the fault's reason.",
            ["level", "reason"],
            registry=registry,
        )
        self.recovery = Histogram(
            "resurge_recovery_duration_seconds",
            "From a fault's detection to the new generation's training (first step or "
            "rendezvous passed), by level.",
            ["level"],
            buckets=RECOVERY_BUCKETS,
            registry=registry,
        )
        for level in RecoveryLevel:
            self.recovery.labels(level.value)
        self.meter = meter or GoodputMeter()
        registry.register(GoodputCollector(self.meter))
        self._reason = BoundedLabel()

    def restarted(self, level: RecoveryLevel, reason: str) -> None:
        """Count one restart decided at ``level`` for a fault of ``reason``."""
        self.restarts.labels(level.value, self._reason(reason)).inc()

    def recovered(self, job: str, level: RecoveryLevel, seconds: float) -> None:
        """A recovery of ``job`` at ``level`` took ``seconds``."""
        self.recovery.labels(level.value).observe(seconds)
        self.meter.restarted(job, seconds)
