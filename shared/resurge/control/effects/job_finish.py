"""Carrying out a finished job's last steps (:mod:`resurge.control.decisions.job_end`), each once.

:func:`finish_job` does the steps ``JobRecord.ending`` still owes, in order, and marks
each done in the record (compare-and-set) after it succeeded:

1. the final Stop to every replica of the ending (its agents end once their workers
   are down); stored before the phase, so an agent ends on its Stop, not on the
   deletion the phase leads to;
2. PhaseChanged on ``action.<job>``;
3. the worker groups deleted.

Each step is safe to repeat (command and event ids derived from the job, replica and
generation; deleting an absent worker group is fine), so a step done again after a
failure changes nothing. A failure raises; what is left stays owed in the record.
"""

from __future__ import annotations

from resurge.cluster import ClusterBackend
from resurge.control.decisions.job_end import Step, mark_ended
from resurge.control.effects.job_messages import announce_phase, send_stops
from resurge.control.state.records import JobRecord, JobStore
from resurge.runtime.bus import Bus

__all__ = ["finish_job"]


async def finish_job(bus: Bus, backend: ClusterBackend, store: JobStore, record: JobRecord) -> None:
    """Do the steps ``record``'s ending still owes (none without one); raise the first
    failure."""
    ending = record.ending
    if ending is None:
        return
    if not ending.stopped:
        await send_stops(
            bus, record, record.generation, ending.reason, final=True, placements=ending.placements
        )
        await _mark(store, record, "stopped")
    if not ending.announced:
        await announce_phase(bus, ending.previous, record)
        await _mark(store, record, "announced")
    if not ending.released:
        for p in ending.placements:
            await backend.delete_worker_group(record.name, p.replica, p.node)
        await _mark(store, record, "released")


async def _mark(store: JobStore, record: JobRecord, step: Step) -> None:
    await store.mutate(record.name, lambda r: mark_ended(r, record.uid, step))
