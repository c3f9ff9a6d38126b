"""Counting checkpoint reports into a job's resume point (a pure change of its record).

A step's checkpoint is complete once every rank of one generation reported it saved.
Reports are kept per (generation, world size, step), and a report counts only with
those of its own generation and world size: the ranks of a stopped generation and part
of the next one never add up to a complete step while the rest of the next one is
still writing it. A report that names no world size (an agent of an earlier release)
counts only for the record's current generation, at the record's world size. Only
steps newer than the resume point are kept, the newest :data:`STEPS_KEPT`.
"""

from __future__ import annotations

from resurge.control.state.records import CheckpointRef, CheckpointReports, JobRecord

__all__ = ["STEPS_KEPT", "apply_checkpoint"]

STEPS_KEPT = 8


def apply_checkpoint(
    record: JobRecord,
    rank: int,
    step: int,
    path: str,
    *,
    generation: int | None,
    world_size: int | None,
) -> bool:
    """Count rank ``rank`` of ``generation`` (of ``world_size`` ranks; None: the record's,
    for its current generation only) having saved checkpoint ``step`` at ``path``; once
    every rank of that generation has reported the step, it becomes the resume point.
    True if anything changed."""
    if generation is None:
        return False
    latest = record.latest_checkpoint
    if latest is not None and step <= latest.step:
        return False
    world = world_size
    if world is None:
        if generation != record.generation:
            return False
        world = record.world_size
    if not 0 <= rank < world:
        return False
    key = (generation, world, step)
    known = next(
        (e for e in record.checkpoint_reports if (e.generation, e.world_size, e.step) == key), None
    )
    ranks = set(known.ranks if known is not None else ()) | {rank}
    if len(ranks) == world:
        record.latest_checkpoint = CheckpointRef(step=step, path=path)
        record.checkpoint_reports = [e for e in record.checkpoint_reports if e.step > step]
        return True
    if known is not None and len(ranks) == len(known.ranks):
        return False
    entry = CheckpointReports(
        generation=generation, world_size=world, step=step, ranks=sorted(ranks)
    )
    others = [e for e in record.checkpoint_reports if e is not known]
    kept = sorted([*others, entry], key=lambda e: (e.step, e.generation, e.world_size))
    record.checkpoint_reports = kept[-STEPS_KEPT:]
    return True
