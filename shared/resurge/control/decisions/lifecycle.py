"""A job's lifecycle: the phases a job record may move between, in one table, and the
one function that moves it and says why.

Every phase change of a job record goes through :func:`move_to`, which refuses a move
the table does not hold (:class:`PhaseMoveError`: a bug in the caller, never a user's
input) and writes the phase and its message together. The table, from each phase:

- ``Pending``: admitted (``Running``); put back to wait (``Pending``: a cluster restart).
- ``Running``: a fault's recovery (``Recovering``), a resize (``Resizing``), back to wait
  for capacity (``Pending``: a node fault with no node to move to, a suspension, a
  cluster restart), a recovery closed (``Running``), the end (``Succeeded``, ``Failed``).
- ``Recovering`` and ``Resizing``: trained again (``Running``), another fault or resize
  meanwhile (``Recovering``, ``Resizing``), back to wait, or the end.
- ``Succeeded`` and ``Failed``: nothing; a job submitted again under its name is a new
  run with a record of its own.
"""

from __future__ import annotations

from resurge.control.state.records import JobRecord
from resurge.events import JobPhase

__all__ = ["TRANSITIONS", "PhaseMoveError", "move_to"]

_P, _RUN, _REC, _RES = JobPhase.PENDING, JobPhase.RUNNING, JobPhase.RECOVERING, JobPhase.RESIZING
_DONE = (JobPhase.SUCCEEDED, JobPhase.FAILED)

TRANSITIONS: dict[JobPhase, frozenset[JobPhase]] = {
    _P: frozenset({_P, _RUN}),
    _RUN: frozenset({_P, _RUN, _REC, _RES, *_DONE}),
    _REC: frozenset({_P, _RUN, _REC, _RES, *_DONE}),
    _RES: frozenset({_P, _RUN, _REC, _RES, *_DONE}),
    JobPhase.SUCCEEDED: frozenset(),
    JobPhase.FAILED: frozenset(),
}


class PhaseMoveError(ValueError):
    """A phase change the lifecycle table does not allow."""


def move_to(record: JobRecord, phase: JobPhase, why: str) -> JobPhase:
    """Move ``record`` to ``phase``, ``why`` as its message; the phase it left."""
    before = record.phase
    if phase not in TRANSITIONS[before]:
        raise PhaseMoveError(f"job {record.name}: no move from {before.value} to {phase.value}")
    record.phase = phase
    record.message = why
    return before
