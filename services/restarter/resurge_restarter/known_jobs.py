"""What the restarter remembers about jobs to skip record reads: bounded, oldest first out.

The progress consumer sees every step of every job; a job known to report progress and
already seen past its resume point needs no record read. The furthest step each job's
newest generation seen completed is kept here too (any rank's), for the policy to tell a
generation that trained further than the one before from one that got no further; it
is what this instance saw, so it may lag a step behind, or miss steps another restarter
instance consumed. That knowledge is a cache: an
entry that is gone only costs one record read, so the cache holds at most ``limit``
jobs and drops the longest-remembered one first (counted), instead of growing with
every job that ever ran. A job whose record is deleted is forgotten (:meth:`KnownJobs.forget`):
a job submitted again under its name is a new run whose generations start at 0 again.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["JOBS_REMEMBERED", "KnownJobs"]

V = TypeVar("V")

# Jobs whose progress knowledge one restarter keeps.
JOBS_REMEMBERED = 10_000


class KnownJobs:
    """Job -> the newest generation seen past its resume point, for jobs known to report
    progress; at most ``limit`` jobs, the oldest entry dropped first."""

    def __init__(self, registry: CollectorRegistry, limit: int = JOBS_REMEMBERED) -> None:
        self.limit = limit
        self._progressed: dict[str, int] = {}
        self._reporting: dict[str, None] = {}
        self._reached: dict[str, tuple[int, int]] = {}
        self.size = Gauge(
            "resurge_restarter_known_jobs",
            f"Jobs the restarter remembers progress facts of (at most {limit} each).",
            ["fact"],
            registry=registry,
        )
        self.dropped = Counter(
            "resurge_restarter_known_jobs_dropped_total",
            "Jobs forgotten because the cache was full (each costs one record read later).",
            registry=registry,
        )
        self.size.labels("reporting").set_function(lambda: len(self._reporting))
        self.size.labels("progressed").set_function(lambda: len(self._progressed))
        self.size.labels("reached").set_function(lambda: len(self._reached))

    def reports(self, job: str) -> bool:
        """Whether ``job`` is known to report progress."""
        return job in self._reporting

    def progressed(self, job: str) -> int:
        """The newest generation of ``job`` seen past its resume point (-1: none known)."""
        return self._progressed.get(job, -1)

    def reached(self, job: str, generation: int) -> int | None:
        """The furthest step seen completed in ``generation`` of ``job`` (None: none seen)."""
        known = self._reached.get(job)
        return known[1] if known is not None and known[0] == generation else None

    def set_reached(self, job: str, generation: int, step: int) -> None:
        """A rank of ``job`` completed ``step`` in ``generation``."""
        known = self._reached.get(job)
        if known is None or known[0] < generation or (known[0] == generation and known[1] < step):
            self._put(self._reached, job, (generation, step))

    def set_reports(self, job: str) -> None:
        """Remember that ``job`` reports progress."""
        self._put(self._reporting, job, None)

    def set_progressed(self, job: str, generation: int) -> None:
        """Remember ``job``'s newest generation past its resume point."""
        self._put(self._progressed, job, generation)

    def forget(self, job: str) -> None:
        """``job``'s record was deleted: a job submitted again under its name is a new
        run, from generation 0, and none of this holds for it."""
        for facts in (self._progressed, self._reporting, self._reached):
            facts.pop(job, None)

    def _put(self, facts: dict[str, V], job: str, value: V) -> None:
        facts.pop(job, None)  # re-inserted: the newest again
        facts[job] = value
        while len(facts) > self.limit:
            del facts[next(iter(facts))]
            self.dropped.inc()
