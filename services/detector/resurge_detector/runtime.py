"""Runs the enabled detectors over raw events: dispatch by kind, ticks, partitions.

:class:`DetectorRuntime` is the detector service without I/O: it keeps the job records
of the jobs this replica judges, hands each raw event to the detectors that take its
kind, calls every detector's ``tick`` on demand, and collects what they conclude. A
detector that raises is counted and logged (once a minute); it never stops the others.

Partitioning: with ``replicas`` detector replicas, replica ``index`` judges the jobs
whose name hashes (BLAKE2b, stable across processes) to ``index`` modulo ``replicas``,
so each job, and each of its ranks, is judged by exactly one replica. Node-level
events go to every replica (each judges them for its own jobs); node capacity is
published by replica 0 only.

Durable state (detectors that implement :class:`~resurge.detection.DurableState`):
:meth:`DetectorRuntime.state_changes` collects what changed as
``(detector, job, key) -> value or None``, and :meth:`DetectorRuntime.restore_state`
hands a stored entry back to its detector when this replica judges the job.

Order: the service reads the fault-grade raw kinds (worker exits, worker fault
reports, agent states, GPU errors) from a stream of their own, apart from the
telemetry, so an exit may be read before or after its worker's last log lines and
progress reports. Nothing here depends on that order: a worker's exit carries its
last output lines (``ProcessExited.last_output``), which the log rules judge as they
judge log lines (a rule fires once per rank and generation, whichever way it saw the
line first), and the detectors of a kind that also read log lines get each event of
that kind before the others, so a log rule's fault on a crashing worker's last lines
comes before the fault of its exit (the restarter acts on the first fault of a
generation) whichever stream was read first.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from resurge.contract.subjects import NODE_LEVEL_JOB
from resurge.control.state.record_entries import RecordReader
from resurge.control.state.records import JobRecord
from resurge.detection import (
    Detector,
    DetectorContext,
    DurableState,
    ForgetsJobs,
    FrozenJob,
    JobView,
)
from resurge.events import CapacityChanged, Envelope, FaultDetected, Source
from resurge.runtime.logs import RateLimitedLog

__all__ = ["DetectorRuntime", "Partition", "StateKey"]

StateKey = tuple[str, str, str]  # detector, job, key

log = logging.getLogger("resurge.detector")


@dataclass(frozen=True)
class Partition:
    """Which jobs this detector replica judges: those whose name hashes to ``index``."""

    replicas: int = 1
    index: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.replicas:
            raise ValueError(f"detector index {self.index} is not in 0..{self.replicas - 1}")

    def owns(self, job: str) -> bool:
        """Whether this replica judges ``job``."""
        if self.replicas == 1:
            return True
        digest = hashlib.blake2b(job.encode(), digest_size=8).digest()
        return int.from_bytes(digest) % self.replicas == self.index


class DetectorRuntime:
    """The enabled detectors over raw events, for the jobs of one partition."""

    def __init__(self, detectors: Sequence[Detector], source: Source, partition: Partition) -> None:
        self.detectors = list(detectors)
        self.source = source
        self.partition = partition
        self.jobs: dict[str, JobView] = {}
        self.failures: dict[str, int] = defaultdict(int)
        self._by_kind: dict[str, list[Detector]] = defaultdict(list)
        # Those that read log lines first (see the module docstring), else in order.
        for detector in sorted(self.detectors, key=lambda d: "log_line" not in d.kinds):
            for kind in detector.kinds:
                self._by_kind[kind].append(detector)
        self._log = RateLimitedLog(log, interval=60.0)
        self.records = RecordReader(log)
        # Checked once: a protocol check looks up every member each time.
        self._durable = [d for d in self.detectors if isinstance(d, DurableState)]
        self._forgetting = [d for d in self.detectors if isinstance(d, ForgetsJobs)]
        # Told of each fault a raw event led to, with that event (detection latency).
        self.on_fault: Callable[[Envelope, FaultDetected], None] | None = None

    @property
    def kinds(self) -> set[str]:
        """Every raw event kind some detector takes."""
        return set(self._by_kind)

    def set_job(self, name: str, record: JobRecord | None) -> None:
        """Keep a read-only view of ``name``'s record (:class:`~resurge.detection.FrozenJob`)
        if this replica judges it; None forgets it. A record
        deleted, or replaced by a new run's (another ``uid``), makes every detector that
        keeps state by job name forget the job (:class:`ForgetsJobs`)."""
        known = self.jobs.get(name)
        if known is not None and (record is None or record.uid != known.uid):
            for detector in self._forgetting:
                try:
                    detector.forget_job(name)
                except Exception as error:
                    self._failed(detector, error)
        if record is None or not self.partition.owns(name):
            self.jobs.pop(name, None)
        else:
            self.jobs[name] = FrozenJob.of(record)

    def put_job(self, name: str, value: bytes | None) -> None:
        """A jobs-bucket entry of ``name`` (None or empty: deleted): :meth:`set_job` with
        its record; a record that does not validate here (a newer schema) is logged,
        counted (``records.skipped``) and skipped, and the last one read is kept."""
        if not value:
            self.set_job(name, None)
            return
        record = self.records.read(name, value)
        if record is not None:
            self.set_job(name, record)

    def owns_event(self, event: Envelope) -> bool:
        """Whether this replica judges ``event`` (node-level events: every replica)."""
        return event.job in (None, NODE_LEVEL_JOB) or self.partition.owns(event.job)

    def observe(self, event: Envelope, now: datetime) -> list[Envelope]:
        """What the detectors conclude from one event."""
        return self.observe_all([event], now)

    def observe_all(self, events: Iterable[Envelope], now: datetime) -> list[Envelope]:
        """Hand each event to the detectors of its kind; what they conclude, in order."""
        ctx = DetectorContext(now=now, source=self.source, jobs=self.jobs)
        out: list[Envelope] = []
        by_kind = self._by_kind
        every_job = self.partition.replicas == 1
        for event in events:
            detectors = by_kind.get(event.kind)
            if not detectors or not (every_job or self.owns_event(event)):
                continue
            for detector in detectors:
                try:
                    result = detector.observe(event, ctx)
                    if not result:  # the usual answer: nothing
                        continue
                    concluded = list(result)
                except Exception as error:
                    self._failed(detector, error)
                    continue
                out += concluded
                self._tell_faults(event, concluded)
        return self._keep(out) if out else out

    def _tell_faults(self, event: Envelope, concluded: Iterable[Envelope]) -> None:
        if self.on_fault is None:
            return
        for fault in concluded:
            if isinstance(fault, FaultDetected):
                self.on_fault(event, fault)

    def tick(self, now: datetime) -> list[Envelope]:
        """What the detectors conclude from the passing of time, at ``now``."""
        ctx = DetectorContext(now=now, source=self.source, jobs=self.jobs)
        out: list[Envelope] = []
        for detector in self.detectors:
            try:
                out += detector.tick(ctx)
            except Exception as error:
                self._failed(detector, error)
        return self._keep(out)

    def state_changes(self) -> dict[StateKey, bytes | None]:
        """What the durable detectors changed since the last call (None: delete)."""
        changes: dict[StateKey, bytes | None] = {}
        for detector in self._durable:
            for (job, key), value in detector.state_changes().items():
                changes[(detector.name, job, key)] = value
        return changes

    def restore_state(self, detector_name: str, job: str, key: str, value: bytes) -> bool:
        """Give a stored entry back to its detector; False when no detector here takes it."""
        if not self.partition.owns(job):
            return False
        for detector in self.detectors:
            if detector.name == detector_name and isinstance(detector, DurableState):
                try:
                    detector.restore_state(job, key, value)
                except Exception as error:
                    self._failed(detector, error)
                    return False
                return True
        return False

    def _failed(self, detector: Detector, error: Exception) -> None:
        self.failures[detector.name] += 1
        self._log.warning(
            detector.name, f"detector {detector.name} failed: {error!r}", reason="plugin_error"
        )

    def _keep(self, out: Iterable[Envelope]) -> list[Envelope]:
        return [
            e for e in out if not (isinstance(e, CapacityChanged) and self.partition.index != 0)
        ]
