"""Loss-spike detector: pure logic, no I/O.

Each worker, keyed by (job, generation, rank), keeps its last ``window`` losses. Once it
has ``warmup`` of them, a loss above ``factor`` times their mean is a spike: a
process-scope FaultDetected (reason ``loss_spike``, suggested level ``process``), so the
restarter restarts the job's workers from the latest checkpoint.

- One fault per spike. A spike's losses stay out of the window, and losses that stay
  above the limit belong to the same spike until one falls below it again. The fault id
  names the step where the spike began, so the same spike seen twice (a redelivered
  event) has the same fault id; the fault's event id is derived from the input event's,
  so JetStream stores a re-published fault once.
- A step at or before the last one seen for the worker is ignored (redelivered or late).
- Bounded work and memory: a fixed window per worker; a job's older generations are
  dropped when a newer one reports, and workers silent for :data:`FORGET_AFTER` are
  dropped by ``tick`` (one pass every :data:`PRUNE_EVERY`).
- The mean must be positive (losses usually are); non-finite values are ignored
  (``resurge.worker`` never sends them).

Settings are read from the environment once, at construction: the detector service
makes each detector with no arguments, so the environment is how it is configured.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from resurge.detection import DetectorContext
from resurge.events import Envelope, FaultDetected, FaultScope, Progress, RecoveryLevel

__all__ = [
    "ALERT_ONLY_ENV",
    "FACTOR_ENV",
    "FORGET_AFTER",
    "METRIC_ENV",
    "PRUNE_EVERY",
    "WARMUP_ENV",
    "WINDOW_ENV",
    "LossSpikeDetector",
]

# How many times the recent mean a loss must exceed to be a spike (a number >= 1).
FACTOR_ENV = "LOSS_SPIKE_FACTOR"
# How many losses a worker must have reported in this generation before any is judged.
WARMUP_ENV = "LOSS_SPIKE_WARMUP"
# How many recent losses the mean is taken over (at least the warm-up).
WINDOW_ENV = "LOSS_SPIKE_WINDOW"
# Which progress metric is the loss, for scripts that report it under another name.
METRIC_ENV = "LOSS_SPIKE_METRIC"
# "true" reports spikes for people and dashboards without restarting anything.
ALERT_ONLY_ENV = "LOSS_SPIKE_ALERT_ONLY"

DEFAULT_FACTOR = 10.0
DEFAULT_WARMUP = 5
DEFAULT_WINDOW = 20
DEFAULT_METRIC = "loss"
FORGET_AFTER = timedelta(minutes=30)
# Ticks come often (every 0.1 s by default); forgetting needs a pass over every worker.
PRUNE_EVERY = timedelta(minutes=1)

_Key = tuple[str, int, int]  # job, generation, rank
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass
class _Worker:
    window: int
    seen: datetime
    last_step: int = -1
    spike: str | None = None  # fault id of the spike in progress
    losses: deque[float] = field(init=False)

    def __post_init__(self) -> None:
        self.losses = deque(maxlen=self.window)


class LossSpikeDetector:
    """Fault a worker whose loss jumps far above its recent mean (see the module doc)."""

    name = "loss_spike"
    kinds = frozenset({"progress"})

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.factor = _number(env, FACTOR_ENV, DEFAULT_FACTOR, minimum=1.0)
        self.warmup = int(_number(env, WARMUP_ENV, DEFAULT_WARMUP, minimum=1, integer=True))
        window = int(_number(env, WINDOW_ENV, DEFAULT_WINDOW, minimum=1, integer=True))
        self.window = max(self.warmup, window)
        self.metric = env.get(METRIC_ENV, "").strip() or DEFAULT_METRIC
        self.alert_only = _flag(env, ALERT_ONLY_ENV)
        self._workers: dict[_Key, _Worker] = {}
        self._newest: dict[str, int] = {}  # job -> newest generation seen
        self._pruned: datetime | None = None

    def observe(self, event: Envelope, ctx: DetectorContext) -> list[FaultDetected]:
        if not isinstance(event, Progress):
            return []
        job, generation, rank = event.job, event.generation, event.rank
        loss = event.metrics.get(self.metric)
        if job is None or generation is None or rank is None or loss is None:
            return []
        if not math.isfinite(loss) or not self._current(job, generation):
            return []
        worker = self._workers.get((job, generation, rank))
        if worker is None:
            worker = self._workers[(job, generation, rank)] = _Worker(self.window, ctx.now)
        if event.step <= worker.last_step:
            return []
        worker.last_step = event.step
        worker.seen = ctx.now
        if len(worker.losses) >= self.warmup:
            mean = math.fsum(worker.losses) / len(worker.losses)
            if mean > 0 and loss > self.factor * mean:
                return self._spike(event, ctx, worker, loss, mean)
        worker.spike = None
        worker.losses.append(loss)
        return []

    def tick(self, ctx: DetectorContext) -> list[FaultDetected]:
        if self._pruned is not None and ctx.now - self._pruned < PRUNE_EVERY:
            return []
        self._pruned = ctx.now
        stale = [key for key, w in self._workers.items() if ctx.now - w.seen > FORGET_AFTER]
        for key in stale:
            del self._workers[key]
        jobs = {job for job, _, _ in self._workers}
        for job in [job for job in self._newest if job not in jobs]:
            del self._newest[job]
        return []

    def _current(self, job: str, generation: int) -> bool:
        """False for an older generation; a newer one drops the job's older state."""
        newest = self._newest.get(job, -1)
        if generation < newest:
            return False
        if generation > newest:
            self._newest[job] = generation
            for key in [k for k in self._workers if k[0] == job and k[1] < generation]:
                del self._workers[key]
        return True

    def _spike(
        self, event: Progress, ctx: DetectorContext, worker: _Worker, loss: float, mean: float
    ) -> list[FaultDetected]:
        if worker.spike is not None:
            return []  # still the spike already reported
        worker.spike = fault_id = (
            f"loss_spike:{event.job}:g{event.generation}:r{event.rank}:s{event.step}"
        )
        fault = ctx.fault(
            event,
            fault_id=fault_id,
            reason="loss_spike",
            scope=FaultScope.PROCESS,
            message=(
                f"rank {event.rank} {self.metric} {loss:g} at step {event.step} is "
                f"{loss / mean:.1f}x the mean {mean:g} of its last {len(worker.losses)} "
                f"steps (limit {self.factor:g}x)"
            ),
            evidence={
                "metric": self.metric,
                "loss": loss,
                "mean": mean,
                "ratio": loss / mean,
                "factor": self.factor,
                "window": len(worker.losses),
                "step": event.step,
                "local_rank": event.local_rank,
            },
            suggested_level=RecoveryLevel.PROCESS,
            alert_only=self.alert_only,
        )
        # Derived from the input's id: a redelivered progress report makes the same event.
        return [fault.model_copy(update={"id": f"fault-{event.id}"})]


def _number(
    env: Mapping[str, str], name: str, default: float, *, minimum: float, integer: bool = False
) -> float:
    """``name`` as a number >= ``minimum`` (an integer where asked), or ``default`` if unset."""
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum:
        what = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {what} >= {minimum:g}, not {text!r}")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name} must be true or false, not {text!r}")
