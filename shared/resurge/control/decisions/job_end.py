"""A finished job's last steps, as the job record owes them: pure functions, no I/O.

A job that fails (the restarter's decision) or succeeds (the scaler's, once every
replica finished) gets :class:`~resurge.control.state.records.JobEnding` in the same
compare-and-set as its phase (:func:`begin_ending`). Its steps, in order: the final Stop
to every replica, the phase announced, the worker groups deleted. Each is marked done
in the record once it succeeded (:func:`mark_ended`), so what a failure left undone is
found in the record and done later: by the instance that wrote the phase until its
claim lapses, then by any restarter that claims it (:func:`claim_ending`). Carrying the
steps out: :mod:`resurge.control.effects.job_finish`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from resurge.control.state.records import JobEnding, JobRecord, PendingRecovery, Placement
from resurge.events import JobPhase

__all__ = ["ENDING_LEASE_SECONDS", "Step", "begin_ending", "claim_ending", "mark_ended"]

# How long the instance that finished a job has for its last steps before any restarter
# may take them over (the restarter's own lease is the same by default).
ENDING_LEASE_SECONDS = 3.0

Step = Literal["stopped", "announced", "released"]
"""A step of a job's ending, by the flag that marks it done."""


def begin_ending(
    record: JobRecord,
    *,
    previous: JobPhase,
    reason: str,
    plan: PendingRecovery | None,
    claimant: str,
    now: datetime,
    lease_seconds: float,
) -> None:
    """Note in ``record`` (just moved to a finished phase from ``previous``) the steps it
    owes, claimed by ``claimant`` for ``lease_seconds``. ``plan``: the recovery or resize
    the record held before; one not yet carried out may have left workers where the
    record no longer places any, and those are stopped and released too."""
    placements = list(record.placements)
    if plan is not None and not plan.dispatched:
        placements += _missing(plan.stop_placements, placements)
    record.ending = JobEnding(
        previous=previous,
        reason=reason,
        placements=placements,
        claimed_by=claimant,
        claimed_until=now + timedelta(seconds=lease_seconds),
    )


def claim_ending(record: JobRecord, claimant: str, now: datetime, lease_seconds: float) -> bool:
    """Take over the steps ``record`` still owes once their claim lapsed (or is ours).
    True if taken."""
    ending = record.ending
    if ending is None or ending.done:
        return False
    held = ending.claimed_until is not None and now < ending.claimed_until
    if ending.claimed_by != claimant and held:
        return False
    until = now + timedelta(seconds=lease_seconds)
    record.ending = ending.model_copy(update={"claimed_by": claimant, "claimed_until": until})
    return True


def mark_ended(record: JobRecord, uid: str, step: Step) -> bool:
    """Mark ``step`` of run ``uid``'s ending done. True if it was not yet."""
    ending = record.ending
    if record.uid != uid or ending is None or getattr(ending, step):
        return False
    record.ending = ending.model_copy(update={step: True})
    return True


def _missing(extra: list[Placement], placements: list[Placement]) -> list[Placement]:
    """The placements in ``extra`` whose (replica, node) ``placements`` lacks."""
    have = {(p.replica, p.node) for p in placements}
    return [p for p in extra if (p.replica, p.node) not in have]
