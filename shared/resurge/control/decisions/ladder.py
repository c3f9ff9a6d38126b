"""The recovery ladder as data (DESIGN section 4): one row per rung, cheapest first.

Each :class:`Rung` says what a restart at its level does, so that deciding a level
(:mod:`resurge.control.decisions.recovery_policy`), carrying the plan out and simulating it
(:mod:`resurge.simulation`) read the same row:

- ``in_process``: the workers restart inside their processes (needs workers under
  ``resurge.worker.restartable``; a job without them takes the next rung up);
- ``recreates``: which worker groups are deleted and created again: none, the faulty
  replica's (all of them where the fault names none), or all;
- ``leaves_node``: whether the replicas on the fault's node move elsewhere: ``always``
  (the ``node`` rung), ``node_faults`` (the ``job`` rung, for a fault about a node or a
  repeat offender: restarting every replica where it was would run one on it again), or
  ``never``;
- ``node_faults_only``: a rung only for faults about a node (node scope or a repeat
  offender); a crashing process climbs past it, never cordoning;
- ``simulated_seconds``: a restart at this rung measured on a small job, from the fault to
  the new generation's first step (``bench/recovery.py`` medians, 2 x 2 ranks on a 2-core
  CPU machine; ``pod``, ``node`` and ``job``: its cold relaunch of every worker). The
  simulator prices a restart from parts (:mod:`resurge.simulation.costs`) instead, in
  the same order at that size, adding what grows with scale (docs/simulation.md).

A fault's scope sets the lowest rung it may take (:data:`SCOPE_FLOOR`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from resurge.events import FaultScope, RecoveryLevel

__all__ = ["LADDER", "RUNGS", "SCOPE_FLOOR", "Rung", "one_above", "rung"]


@dataclass(frozen=True)
class Rung:
    """What a restart at ``level`` does (the module docstring)."""

    level: RecoveryLevel
    in_process: bool
    recreates: Literal["none", "faulty", "all"]
    leaves_node: Literal["never", "node_faults", "always"]
    node_faults_only: bool
    simulated_seconds: float


RUNGS: tuple[Rung, ...] = (
    Rung(RecoveryLevel.IN_PROCESS, True, "none", "never", False, 0.44),
    Rung(RecoveryLevel.PROCESS, False, "none", "never", False, 0.64),
    Rung(RecoveryLevel.POD, False, "faulty", "never", False, 14.4),
    Rung(RecoveryLevel.NODE, False, "none", "always", True, 14.4),
    Rung(RecoveryLevel.JOB, False, "all", "node_faults", False, 14.4),
)
LADDER: list[RecoveryLevel] = [r.level for r in RUNGS]
_BY_LEVEL = {r.level: r for r in RUNGS}

SCOPE_FLOOR: dict[FaultScope, RecoveryLevel] = {
    FaultScope.PROCESS: RecoveryLevel.IN_PROCESS,
    FaultScope.NODE: RecoveryLevel.NODE,
    FaultScope.JOB: RecoveryLevel.JOB,
}


def rung(level: RecoveryLevel) -> Rung:
    """The row of ``level``."""
    return _BY_LEVEL[level]


def one_above(level: RecoveryLevel, node_rung: bool) -> RecoveryLevel:
    """The rung above ``level`` for a fault (the top one stays), skipping the rungs for
    node faults where ``node_rung`` is false."""
    for above in LADDER[LADDER.index(level) + 1 :]:
        if node_rung or not rung(above).node_faults_only:
            return above
    return level
