"""The detector plugin API: what a detector is, what it is given, how it is found.

A detector turns raw events into fault (and capacity) events. It is a plain object::

    class NanLoss:
        name = "nan_loss"
        kinds = frozenset({"progress"})          # raw event kinds it wants

        def observe(self, event, ctx):           # one raw event; return what it concludes
            if math.isnan(event.metrics.get("loss", 0.0)):
                return [ctx.fault(event, fault_id=..., reason="nan_loss", message=...)]
            return []

        def tick(self, ctx):                     # every tick_seconds: timeouts and windows
            return []

Detectors are found through the entry-point group ``resurge.detectors`` (the built-in
ones are registered there too); the value is a callable that takes no arguments and
returns the detector. The detector service calls ``observe`` and ``tick`` from one
thread, so a detector needs no locks; both must return quickly (bound the work per
event). Context objects may gain fields: read them by name.

A detector whose state must survive a restart of the detector service (a count that
no later event could rebuild) also implements :class:`DurableState`: the service
stores what ``state_changes`` returns in its JetStream KV bucket before it acks the
raw events that caused it, and hands every stored entry of the jobs it judges to
``restore_state`` before it reads any raw event. Detectors without it are unchanged.
A detector that keeps state by job name also implements :class:`ForgetsJobs`: a job
deleted and submitted again under its name is a new run, and ``forget_job`` drops what
was kept of the old one.

Detectors in other languages need none of this: subscribe to
``resurge.v1.raw.>`` and publish ``fault_detected`` events (see docs/detectors.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from resurge.contract.families import FAULT_GRADE_KINDS
from resurge.control.state.records import JobRecord, Placement
from resurge.events import (
    Envelope,
    FaultDetected,
    FaultScope,
    JobPhase,
    RecoveryLevel,
    Severity,
    Source,
)
from resurge.jobspec import TrainingJob

__all__ = [
    "ENTRY_POINT_GROUP",
    "LANE_KINDS",
    "Detector",
    "DetectorContext",
    "DurableState",
    "ForgetsJobs",
    "FrozenJob",
    "JobView",
    "UnknownDetectorError",
    "available_detectors",
    "load_detectors",
]

ENTRY_POINT_GROUP = "resurge.detectors"

# The fault-grade raw kinds, few and urgent: stored in a stream of their own, which the
# detector service reads apart from the telemetry (docs/detectors.md).
LANE_KINDS = FAULT_GRADE_KINDS


class JobView(Protocol):
    """A job as a detector sees it: read only. The control plane writes job records; a
    detector reads what it judges by (its spec, generation, placements) and concludes
    events, never edits."""

    @property
    def name(self) -> str:
        """The job's name."""

    @property
    def uid(self) -> str:
        """This run of the job (a job submitted again under its name is a new run)."""

    @property
    def phase(self) -> JobPhase:
        """Where the job is in its life."""

    @property
    def generation(self) -> int:
        """The job's current generation."""

    @property
    def spec(self) -> TrainingJob:
        """The job as submitted (its monitoring settings as last submitted)."""

    @property
    def placements(self) -> Sequence[Placement]:
        """Where its replicas run in the current generation."""

    @property
    def finished_replicas(self) -> Sequence[int]:
        """Replicas of the current generation whose workers all exited 0."""

    @property
    def world_size(self) -> int:
        """Worker processes in the current generation."""


@dataclass(frozen=True, slots=True)
class FrozenJob:
    """The :class:`JobView` the detector service hands its detectors: a copy of the
    record's fields they read, that no detector can change (the spec and placements are
    frozen models)."""

    name: str
    uid: str
    phase: JobPhase
    generation: int
    spec: TrainingJob
    placements: tuple[Placement, ...]
    finished_replicas: tuple[int, ...]
    world_size: int

    @classmethod
    def of(cls, record: JobRecord) -> FrozenJob:
        """The view of ``record`` as it is now."""
        return cls(
            name=record.name,
            uid=record.uid,
            phase=record.phase,
            generation=record.generation,
            spec=record.spec,
            placements=tuple(record.placements),
            finished_replicas=tuple(record.finished_replicas),
            world_size=record.world_size,
        )


@dataclass(frozen=True)
class DetectorContext:
    """What a detector may consult: the clock, the jobs it judges, how to sign events."""

    now: datetime
    source: Source
    jobs: Mapping[str, JobView] = field(default_factory=dict)

    def job(self, name: str | None) -> JobView | None:
        """The record of job ``name`` if this detector replica judges it; else None."""
        return None if name is None else self.jobs.get(name)

    def jobs_on(self, node: str) -> list[JobView]:
        """Running jobs with a replica on ``node``."""
        return [
            r
            for r in self.jobs.values()
            if not r.phase.finished and any(p.node == node for p in r.placements)
        ]

    def fault(
        self,
        about: Envelope | None = None,
        *,
        fault_id: str,
        reason: str,
        scope: FaultScope = FaultScope.PROCESS,
        message: str = "",
        severity: Severity = Severity.ERROR,
        evidence: Mapping[str, Any] | None = None,
        suggested_level: RecoveryLevel | None = None,
        alert_only: bool = False,
        **where: Any,
    ) -> FaultDetected:
        """A FaultDetected about ``about``'s job/replica/node/rank/generation (or ``where``).

        ``alert_only`` marks a fault that is reported but must not be acted on.
        """
        context: dict[str, Any] = {}
        if about is not None:
            context = {
                key: getattr(about, key) for key in ("job", "replica", "node", "rank", "generation")
            }
        context.update(where)
        return FaultDetected(
            source=self.source,
            fault_id=fault_id,
            scope=scope,
            reason=reason,
            severity=Severity.WARNING if alert_only else severity,
            message=message,
            evidence=dict(evidence or {}),
            suggested_level=suggested_level,
            alert_only=alert_only,
            **context,
        )


@runtime_checkable
class Detector(Protocol):
    """A detector plugin: what it is called, which raw event kinds it takes, and what
    it concludes from an event and from the passing of time."""

    name: str
    kinds: frozenset[str]

    def observe(self, event: Any, ctx: DetectorContext) -> Iterable[Envelope]:
        """What one raw event of a kind in ``kinds`` shows (faults, capacity, ...)."""
        ...

    def tick(self, ctx: DetectorContext) -> Iterable[Envelope]:
        """What the passing of time shows at ``ctx.now`` (timeouts, windows)."""
        ...


@runtime_checkable
class DurableState(Protocol):
    """Optional: a detector's state that the service keeps where a restart finds it.

    State is a set of entries ``(job, key) -> bytes``; ``key`` is a short name of the
    detector's choosing (letters, digits, ``-``, ``_``). An entry lives until the
    detector deletes it, or for at most 7 days after its last write.
    """

    def state_changes(self) -> Mapping[tuple[str, str], bytes | None]:
        """Entries changed since the last call: the new value, or None to delete it."""
        ...

    def restore_state(self, job: str, key: str, value: bytes) -> None:
        """One stored entry, given back at start, before any event."""
        ...


@runtime_checkable
class ForgetsJobs(Protocol):
    """Optional: a detector that keeps state per job name forgets a job's run.

    A job deleted and submitted again under its name is a new run, from generation 0:
    what a detector learned of the old run (its newest generation, counts, timers) must
    not hold for the new one. The service calls ``forget_job`` when the job's record is
    deleted, or replaced by one with another ``uid`` (the new run's), before the new
    run's first event reaches the detector."""

    def forget_job(self, job: str) -> None:
        """Drop everything kept for ``job``; durable entries are deleted too."""
        ...


class UnknownDetectorError(LookupError):
    """A detector name that no entry point of the group provides."""


def available_detectors() -> dict[str, Any]:
    """Every detector registered in the ``resurge.detectors`` entry-point group."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_detectors(names: Sequence[str]) -> list[Detector]:
    """Instantiate the named detectors; an unknown name fails naming the group."""
    registered = available_detectors()
    detectors = []
    for name in names:
        if name not in registered:
            known = ", ".join(sorted(registered)) or "none"
            raise UnknownDetectorError(
                f"no detector named {name!r} in entry-point group {ENTRY_POINT_GROUP!r} "
                f"(registered: {known})"
            )
        detector = registered[name].load()()
        if not isinstance(detector, Detector):
            raise TypeError(
                f"entry point {name!r} of {ENTRY_POINT_GROUP!r} did not make a Detector "
                "(needs name, kinds, observe(event, ctx), tick(ctx))"
            )
        detectors.append(detector)
    return detectors
