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
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from resurge.contract.subjects import NODE_LEVEL_JOB
from resurge.control.records import JobRecord
from resurge.detection import Detector, DetectorContext, DurableState
from resurge.events import CapacityChanged, Envelope, Source
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
        self.jobs: dict[str, JobRecord] = {}
        self.failures: dict[str, int] = defaultdict(int)
        self._by_kind: dict[str, list[Detector]] = defaultdict(list)
        for detector in self.detectors:
            for kind in detector.kinds:
                self._by_kind[kind].append(detector)
        self._log = RateLimitedLog(log, interval=60.0)

    @property
    def kinds(self) -> set[str]:
        """Every raw event kind some detector takes."""
        return set(self._by_kind)

    def set_job(self, name: str, record: JobRecord | None) -> None:
        """Keep ``name``'s record if this replica judges it; None forgets it."""
        if record is None or not self.partition.owns(name):
            self.jobs.pop(name, None)
        else:
            self.jobs[name] = record

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
        for event in events:
            detectors = self._by_kind.get(event.kind)
            if not detectors or not self.owns_event(event):
                continue
            for detector in detectors:
                try:
                    out += detector.observe(event, ctx)
                except Exception as error:
                    self._failed(detector, error)
        return self._keep(out)

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
        for detector in self.detectors:
            if isinstance(detector, DurableState):
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
