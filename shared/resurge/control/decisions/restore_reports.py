"""Folding restore reports into a job's record (a pure change of its record).

Each worker that registered its state says once per generation where it took that
state from (StateRestored). :func:`apply_restored` keeps, for the record's current
generation only, which ranks took it from which source, the step, and the words of the
worst source (:data:`WORST_FIRST`): the status says whether a restart resumed from live
memory or fell back to the disk, and why. A report of an older generation is ignored (it
arrives late, after a newer generation began); the first report of a newer one replaces
what was kept. A rank that reports again (a redelivery) changes nothing.
"""

from __future__ import annotations

from resurge.control.state.records import JobRecord, RestoredState
from resurge.events import RestoreSource

__all__ = ["WORST_FIRST", "apply_restored", "live_state_serves_a_resize"]

WORST_FIRST: tuple[RestoreSource, ...] = ("start", "disk", "peer", "memory")
"""Sources by how much work a rank lost with them, most first: the status names the
first of these that any rank reported."""


def apply_restored(
    record: JobRecord,
    generation: int | None,
    rank: int | None,
    step: int | None,
    source: RestoreSource,
    detail: str,
    sharded: bool = False,
    reshardable: bool = False,
) -> bool:
    """Count rank ``rank`` of ``generation`` having restored its state from ``source``
    at ``step`` (None: a fresh start), ``detail`` saying why. True if anything changed."""
    if generation is None or rank is None or generation != record.generation:
        return False
    kept = record.restored
    if kept is None or kept.generation != generation:
        kept = RestoredState(generation=generation)
    if any(rank in ranks for ranks in kept.ranks.values()):
        return False
    ranks = dict(kept.ranks)
    ranks[source] = sorted([*ranks.get(source, []), rank])
    steps = [s for s in (kept.step, step) if s is not None]
    worst = next(s for s in WORST_FIRST if s in ranks)
    first_of_worst = worst == source and len(ranks[source]) == 1
    record.restored = RestoredState(
        generation=generation,
        step=min(steps) if steps else None,
        ranks={s: ranks[s] for s in reversed(WORST_FIRST) if s in ranks},
        detail=detail if first_of_worst else kept.detail,
        sharded=kept.sharded or sharded,
        reshardable=(kept.sharded or sharded)
        and (kept.reshardable or not kept.sharded)
        and (reshardable or not sharded),
    )
    return True


def live_state_serves_a_resize(record: JobRecord) -> bool:
    """Whether a resize of ``record``'s job can take its state from its ranks' memory
    instead of a checkpoint asked for first: its current generation's ranks reported
    protected state (they snapshot it as they train), and either not cut in shards or cut
    in shards that can be cut again (other shards serve only the world size they were cut
    for)."""
    kept = record.restored
    return (
        kept is not None
        and kept.generation == record.generation
        and (not kept.sharded or kept.reshardable)
    )
