"""Where a new generation's protected state comes from: the resume rule, as a pure function.

Every rank of the new generation lists the snapshots it can read on its node
(:class:`Held`: a key and a step each), the lists are gathered, and :func:`plan` gives
each rank the same answer:

- Replicated state (DDP: every rank holds all of it, key ``replicated``): the newest step
  anyone holds. A rank that can read that step on its own node loads it (``memory``);
  every other rank receives it from the lowest rank that holds it (``peer``).
- Sharded state (FSDP, ZeRO: key ``shard-<i>-of-<n>``): the newest step for which every
  shard ``0 .. n-1`` is held by someone. At the world size the generation has now, the
  shard of rank ``i`` goes to rank ``i``. Cut for another world size (a resize), it serves
  only state that can be cut again (``reshardable``: DTensors sharded on their first
  dimension, as FSDP2 cuts them): every rank then gets every old shard, and re-cuts its
  own part of them (:mod:`resurge.worker.protect`); otherwise the disk.
- Never a mixed resume: one step for all ranks, or none. None (``disk``) also when the
  disk checkpoint the control plane assigned is newer than every live step, or when
  nothing is live at all; :attr:`RestorePlan.reason` says which.

Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["REPLICATED", "Held", "RestorePlan", "plan", "shard_key"]

REPLICATED = "replicated"
_SHARD = re.compile(r"^shard-(\d+)-of-(\d+)$")


def shard_key(rank: int, world_size: int) -> str:
    """The key of rank ``rank``'s shard in a world of ``world_size`` ranks."""
    return f"shard-{rank}-of-{world_size}"


@dataclass(frozen=True, order=True)
class Held:
    """A snapshot a rank can read on its node: whose state (``key``) at which ``step``."""

    key: str
    step: int


@dataclass(frozen=True)
class RestorePlan:
    """What every rank does: ``step`` None means resume from the disk (or start)."""

    step: int | None
    reason: str
    # rank -> what it loads: (key, the rank it receives it from; None: its own node holds
    # it), one piece, or every old shard in order when ``cut_from`` is set
    sources: dict[int, list[tuple[str, int | None]]] = field(default_factory=dict)
    cut_from: int | None = None  # the world size the shards were cut for, when re-cut

    def sends(self, rank: int) -> list[tuple[str, int]]:
        """(key, to rank) for each copy ``rank`` sends, by receiver then key order."""
        return [
            (key, to)
            for to, pieces in sorted(self.sources.items())
            for key, giver in pieces
            if giver == rank
        ]


def plan(
    held: Sequence[Sequence[Held]],
    sharded: bool,
    disk_step: int | None = None,
    reshardable: bool = False,
) -> RestorePlan:
    """The plan for a world of ``len(held)`` ranks, ``held[r]`` being what rank ``r`` can
    read on its node; ``disk_step``: the step of the disk checkpoint assigned, if any;
    ``reshardable``: whether every rank's sharded state can be cut again."""
    world = len(held)
    holders: dict[Held, list[int]] = {}
    for rank, snapshots in enumerate(held):
        for snapshot in set(snapshots):
            holders.setdefault(snapshot, []).append(rank)
    cut_for = world
    if sharded:
        step, cut_for, why = _newest_sharded(holders, world, reshardable)
    else:
        steps = [h.step for h in holders if h.key == REPLICATED]
        step, why = (max(steps), "") if steps else (None, "no rank holds a live snapshot")
    if step is None:
        return RestorePlan(None, why)
    if disk_step is not None and disk_step > step:
        return RestorePlan(
            None, f"the disk checkpoint of step {disk_step} is newer than the live step {step}"
        )
    sources: dict[int, list[tuple[str, int | None]]] = {}
    for rank in range(world):
        if not sharded:
            keys = [REPLICATED]
        elif cut_for == world:
            keys = [shard_key(rank, world)]
        else:
            keys = [shard_key(index, cut_for) for index in range(cut_for)]
        sources[rank] = [(key, _giver(rank, sorted(holders[Held(key, step)]))) for key in keys]
    if cut_for != world:
        reason = f"step {step} is live, cut for {cut_for} rank(s): re-cut for {world}"
        return RestorePlan(step, reason, sources, cut_from=cut_for)
    return RestorePlan(step, f"step {step} is live", sources)


def _giver(rank: int, givers: list[int]) -> int | None:
    """None when ``rank`` holds it itself; else one of the holders, spread by rank."""
    return None if rank in givers else givers[rank % len(givers)]


def _newest_sharded(
    holders: dict[Held, list[int]], world: int, reshardable: bool
) -> tuple[int | None, int, str]:
    """The newest step every shard of one world is held at, for that world's size (this
    world's first on a tie; another world's only when ``reshardable``), or why none."""
    by_world: dict[int, dict[int, set[int]]] = {}
    for snapshot in holders:
        match = _SHARD.match(snapshot.key)
        if match is not None:
            index, size = int(match.group(1)), int(match.group(2))
            by_world.setdefault(size, {}).setdefault(snapshot.step, set()).add(index)
    complete = [
        (step, size == world, size)
        for size, steps in by_world.items()
        if size == world or reshardable
        for step, shards in steps.items()
        if shards == set(range(size))
    ]
    if complete:
        step, _, size = max(complete)
        return step, size, ""
    mine = by_world.get(world)
    if mine:
        newest = max(mine)
        missing = sorted(set(range(world)) - mine[newest])
        return None, world, f"no step has every shard live (step {newest} lacks shards {missing})"
    if by_world:
        sizes = ", ".join(str(size) for size in sorted(by_world))
        if reshardable:
            return None, world, f"no step has every shard live (cut for {sizes} rank(s))"
        return (
            None,
            world,
            (
                f"the live shards were cut for {sizes} rank(s), not {world}, and this state "
                "cannot be cut again (only DTensors sharded on their first dimension can)"
            ),
        )
    return None, world, "no rank holds a live snapshot"
