"""Straggler detector: a rank persistently slower than the job's median (pure logic).

Each rank's step time is its ``step_seconds`` metric when the worker reports one (the
compute time, which a synchronous job like DDP needs: there every rank waits for the
slowest in the all-reduce), else the time between its progress reports. Once a rank has
``windowSteps`` new step times after the first ``minSteps`` steps, its window mean is
compared with the median of every rank's latest window mean; slower than ``slowFactor``
times the median for ``consecutiveWindows`` windows in a row is a node-scoped fault with
the evidence (its times and the median). Reported once per rank and generation.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

from resurge.detection import DetectorContext
from resurge.events import Envelope, FaultScope, Progress, RecoveryLevel

__all__ = ["StragglerDetector"]


@dataclass
class _Rank:
    replica: int | None
    node: str | None
    last_time: datetime | None = None
    last_step: int | None = None
    window: deque[float] = field(default_factory=deque)
    new_samples: int = 0
    mean: float | None = None
    strikes: int = 0
    reported: bool = False


class StragglerDetector:
    """Ranks persistently slower than the job's median (see the module docstring)."""

    name = "straggler"
    kinds = frozenset({"progress"})

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, int], dict[int, _Rank]] = {}

    def observe(self, event: Progress, ctx: DetectorContext) -> list[Envelope]:
        """A straggler fault once a rank's slow windows reach the job's limit."""
        record = ctx.job(event.job)
        if record is None or event.generation is None or event.rank is None:
            return []
        settings = record.spec.spec.monitoring.straggler
        if not settings.enabled or event.generation < record.generation:
            return []
        ranks = self._ranks(record.name, event.generation)
        rank = ranks.get(event.rank)
        if rank is None:
            rank = ranks[event.rank] = _Rank(event.replica, event.node)
        seconds = self._step_seconds(rank, event)
        rank.last_time, rank.last_step = event.time, event.step
        if seconds is None or event.step <= settings.min_steps:
            return []
        rank.window.append(seconds)
        while len(rank.window) > settings.window_steps:
            rank.window.popleft()
        rank.new_samples += 1
        if rank.new_samples < settings.window_steps:
            return []
        rank.new_samples = 0
        rank.mean = statistics.fmean(rank.window)
        means = [r.mean for r in ranks.values() if r.mean is not None]
        if len(means) < 2:
            return []
        median = statistics.median(means)
        if rank.mean > settings.slow_factor * median:
            rank.strikes += 1
        else:
            rank.strikes = 0
        if rank.strikes < settings.consecutive_windows or rank.reported:
            return []
        rank.reported = True
        return [
            ctx.fault(
                event,
                fault_id=f"straggler:{record.name}:g{event.generation}:r{event.rank}",
                reason="straggler",
                scope=FaultScope.NODE,
                message=(
                    f"rank {event.rank} on {event.node} takes {rank.mean:.3f} s per step, "
                    f"{rank.mean / median:.1f}x the median {median:.3f} s"
                ),
                evidence={
                    "rank_step_seconds": ",".join(f"{t:.4f}" for t in rank.window),
                    "rank_mean_seconds": round(rank.mean, 6),
                    "median_seconds": round(median, 6),
                    "slow_factor": settings.slow_factor,
                    "windows": rank.strikes,
                },
                suggested_level=RecoveryLevel.NODE,
                alert_only=settings.action == "alert",
            )
        ]

    @staticmethod
    def _step_seconds(rank: _Rank, event: Progress) -> float | None:
        reported = event.metrics.get("step_seconds")
        if reported is not None:
            return reported
        if rank.last_time is None or rank.last_step is None or event.step <= rank.last_step:
            return None
        return (event.time - rank.last_time).total_seconds() / (event.step - rank.last_step)

    def forget_job(self, job: str) -> None:
        """A new run of ``job`` (:class:`~resurge.detection.ForgetsJobs`)."""
        for key in [k for k in self._jobs if k[0] == job]:
            del self._jobs[key]

    def _ranks(self, job: str, generation: int) -> dict[int, _Rank]:
        """The ranks of ``job``'s ``generation``; a new generation forgets the older ones."""
        ranks = self._jobs.get((job, generation))
        if ranks is None:
            for old in [k for k in self._jobs if k[0] == job and k[1] < generation]:
                del self._jobs[old]
            ranks = self._jobs[(job, generation)] = {}
        return ranks

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        """Forget the jobs that are over."""
        for key in [k for k in self._jobs if (r := ctx.job(k[0])) is None or r.phase.finished]:
            del self._jobs[key]
        return []
