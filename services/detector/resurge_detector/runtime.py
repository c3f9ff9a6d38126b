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

Lanes: the fault-grade raw kinds (:data:`LANE_KINDS`: worker exits, worker fault
reports, agent states, GPU errors) are few and urgent, and the service reads them
through consumers of their own (the *fault lane*), apart from the telemetry consumer
(the *main lane*), so a telemetry backlog never delays them. ``observe_all(..., lane=)``
decides, per event and detector, which lane hands the event over, so each reaches each
of its detectors once:

- a detector that takes telemetry too (the hang detector reads exits beside progress)
  gets a fault-grade event from the main lane, in order with the telemetry before it;
- a detector that takes fault-grade kinds only gets it from the fault lane, unless the
  event's job has log rules and a detector here reads log lines: a log rule's fault on
  the last lines of a worker must still come before the fault of its exit (the
  restarter acts on the first fault of a generation), so those events go in order
  through the main lane, as before;
- either lane skips what the other already handled (by event id, a bounded memory),
  so a job record changing between the two looks neither loses nor repeats an event
  (a redelivery to the lane that handled it is handled again, as before).
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from resurge.contract.subjects import NODE_LEVEL_JOB
from resurge.control.record_entries import RecordReader
from resurge.control.records import JobRecord
from resurge.detection import (
    LANE_KINDS,
    Detector,
    DetectorContext,
    DurableState,
    ForgetsJobs,
    FrozenJob,
    JobView,
)
from resurge.events import CapacityChanged, Envelope, FaultDetected, Source
from resurge.runtime.logs import RateLimitedLog

__all__ = ["LANE_KINDS", "DetectorRuntime", "Partition", "StateKey"]

# Fault-grade events remembered as handled by one lane, so the other skips them.
_HANDLED_MEMORY = 100_000

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
        for detector in self.detectors:
            for kind in detector.kinds:
                self._by_kind[kind].append(detector)
        self._log = RateLimitedLog(log, interval=60.0)
        self.records = RecordReader(log)
        # Checked once: a protocol check looks up every member each time.
        self._durable = [d for d in self.detectors if isinstance(d, DurableState)]
        self._forgetting = [d for d in self.detectors if isinstance(d, ForgetsJobs)]
        # Detectors that take fault-grade kinds only: the fault lane may feed them.
        self._lane_detectors = {id(d) for d in self.detectors if d.kinds <= LANE_KINDS}
        self._reads_logs = "log_line" in self._by_kind
        self._handled: OrderedDict[tuple[str, str], bool] = OrderedDict()
        # Told of each fault a raw event led to, with that event (detection latency).
        self.on_fault: Callable[[Envelope, FaultDetected], None] | None = None

    @property
    def kinds(self) -> set[str]:
        """Every raw event kind some detector takes."""
        return set(self._by_kind)

    @property
    def lane_kinds(self) -> set[str]:
        """The fault-grade kinds that some detector may take through the fault lane."""
        return {
            kind
            for kind in LANE_KINDS
            if any(id(d) in self._lane_detectors for d in self._by_kind.get(kind, ()))
        }

    def _in_order(self, event: Envelope) -> bool:
        """Whether ``event`` must reach its detectors in order with its job's log lines."""
        if not self._reads_logs or event.job is None:
            return False
        record = self.jobs.get(event.job)
        return record is not None and bool(record.spec.spec.monitoring.log_rules)

    def _take(self, event: Envelope, detector: Detector, lane: bool | None) -> bool:
        """Whether ``detector`` gets ``event`` from this call (``lane``: see observe_all)."""
        if lane is None or event.kind not in LANE_KINDS:
            return lane is not True
        if id(detector) not in self._lane_detectors:
            return not lane  # it reads telemetry too: in order, from the main lane
        key = (detector.name, event.id)
        handled_by = self._handled.get(key)
        if handled_by is not None:
            return handled_by is lane  # a redelivery to the same lane is handled again
        if lane and self._in_order(event):
            return False
        self._handled[key] = lane
        if len(self._handled) > _HANDLED_MEMORY:
            self._handled.popitem(last=False)
        return True

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

    def observe_all(
        self, events: Iterable[Envelope], now: datetime, *, lane: bool | None = None
    ) -> list[Envelope]:
        """Hand each event to the detectors of its kind; what they conclude, in order.

        ``lane``: None hands every event to every detector of its kind; True: these
        events came through the fault lane, False: through the main lane (each event
        then reaches each detector through one of them, see the module docstring)."""
        ctx = DetectorContext(now=now, source=self.source, jobs=self.jobs)
        out: list[Envelope] = []
        by_kind = self._by_kind
        every_job = self.partition.replicas == 1
        for event in events:
            detectors = by_kind.get(event.kind)
            if not detectors or not (every_job or self.owns_event(event)):
                continue
            if lane is not None and event.kind in LANE_KINDS:
                detectors = [d for d in detectors if self._take(event, d, lane)]
            elif lane:  # telemetry is the main lane's alone
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
