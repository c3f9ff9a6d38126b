"""What a simulation reports: per policy, the time ledger and what it adds up to.

A :class:`Ledger` holds seconds of one job's (or, for a trace, every job's GPU-)time by
cause; :class:`PolicyResult` is one policy's outcome: the effective training time ratio
(ETTR: productive time over the time held), GPU-hours lost by cause, restarts by rung,
faults by kind, where recoveries resumed from and the steps each redid, and for trace
runs the GPU-hours used and the idle capacity elastic jobs put to use. :class:`Summary`
holds every policy's result and writes them as JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CAUSES", "Ledger", "PolicyResult", "Summary"]

CAUSES = ("detection", "restart", "redone", "checkpoint", "waiting", "snapshot")
"""Where lost time goes: a fault not yet seen; restarting (backoff included); training
redone since the last checkpoint (with peer recovery, since the newest live step);
checkpoint writes; waiting for capacity; the snapshots' share of each step (peer
recovery only)."""


@dataclass(slots=True)
class Ledger:
    """Seconds (or GPU-seconds) by cause, and the productive ones."""

    productive: float = 0.0
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))

    def charge(self, cause: str, seconds: float) -> None:
        """Add ``seconds`` lost to ``cause`` (one of :data:`CAUSES`)."""
        if seconds > 0:
            self.lost[cause] += seconds

    @property
    def total(self) -> float:
        """Productive and lost seconds together."""
        return self.productive + sum(self.lost.values())


@dataclass(slots=True)
class PolicyResult:
    """One policy's outcome; GPU-hours are over the whole simulated time."""

    policy: str
    mode: str
    """``job`` (one fixed-size job) or ``trace`` (a job trace, elastic or not)."""
    days: float
    gpus: int
    """GPUs of the job (``job``), or of the cluster (``trace``)."""
    ettr: float
    lost_gpu_hours: dict[str, float]
    productive_gpu_hours: float
    restarts: dict[str, int]
    faults: dict[str, int]
    job_failures: int = 0
    """Times the policy failed the job (a limit spent); it is submitted again."""
    resumes: dict[str, int] = field(default_factory=dict)
    """One-job runs: recoveries by where they resumed from, ``live`` copies in memory
    (peer recovery) or the ``disk`` checkpoint."""
    steps_redone: dict[str, float] = field(default_factory=dict)
    """One-job runs: steps trained again per recovery, ``mean`` and ``max``, and
    ``max_live`` over the recoveries that resumed from live copies."""
    checkpoint_interval_minutes: float = 0.0
    checkpoint_write_seconds: float = 0.0
    used_gpu_hours: float | None = None
    """Trace runs: GPU-hours held by jobs."""
    idle_capacity_used: float | None = None
    """Trace runs, elastic: the share of the GPU-hours the same trace at fixed sizes left
    idle that this run put to use (None without a fixed-size run to compare with)."""
    resizes: int = 0
    nodes: dict[str, int] = field(default_factory=dict)
    """One-job runs with bad nodes, a quarantine or proactive moves: the nodes' record
    (``bad_nodes``, ``attributed_faults``, ``on_bad_nodes``, ``quarantines``,
    ``quarantined_bad``, ``returned_fixed``, ``would_quarantine`` in a dry run,
    ``predicted``, ``planned_moves``)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return asdict(self)


@dataclass(slots=True)
class Summary:
    """Every policy's result, and the settings they ran with."""

    results: list[PolicyResult]
    settings: dict[str, Any]

    def to_json(self) -> str:
        """The summary as indented JSON."""
        body = {"settings": self.settings, "policies": [r.to_dict() for r in self.results]}
        return json.dumps(body, indent=2, sort_keys=False) + "\n"

    def write(self, path: Path) -> Path:
        """Write :meth:`to_json` to ``path``; returns it."""
        path.write_text(self.to_json())
        return path
