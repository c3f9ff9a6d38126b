"""Where a new generation's protected state comes from: the resume rule, as a pure function.

Every rank of the new generation lists the snapshots it can read on its node
(:class:`Held`: a key and a step each), the lists are gathered, and :func:`plan` gives
each rank the same answer:

- Replicated state (DDP: every rank holds all of it, key ``replicated``): the newest step
  anyone holds. A rank that can read that step on its own node loads it (``memory``);
  every other rank receives it from the lowest rank that holds it (``peer``).
- Sharded state (FSDP, ZeRO: key ``shard-<i>-of-<n>``): the newest step for which every
  shard ``0 .. n-1`` is held by someone, at the world size the generation has now (the
  shard of rank ``i`` goes to rank ``i``). Re-sharding to another world size is not done
  here: such a generation resumes from the disk.
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
    # rank -> (key it loads, the rank it receives it from; None: its own node holds it)
    sources: dict[int, tuple[str, int | None]] = field(default_factory=dict)

    def sends(self, rank: int) -> list[tuple[str, int]]:
        """(key, to rank) for each copy ``rank`` sends, in rank order."""
        return sorted(
            ((key, to) for to, (key, giver) in self.sources.items() if giver == rank),
            key=lambda pair: pair[1],
        )


def plan(
    held: Sequence[Sequence[Held]], sharded: bool, disk_step: int | None = None
) -> RestorePlan:
    """The plan for a world of ``len(held)`` ranks, ``held[r]`` being what rank ``r`` can
    read on its node; ``disk_step``: the step of the disk checkpoint assigned, if any."""
    world = len(held)
    holders: dict[Held, list[int]] = {}
    for rank, snapshots in enumerate(held):
        for snapshot in set(snapshots):
            holders.setdefault(snapshot, []).append(rank)
    if sharded:
        found = _newest_sharded(holders, world)
    else:
        steps = [h.step for h in holders if h.key == REPLICATED]
        found = (max(steps), "") if steps else (None, "no rank holds a live snapshot")
    step, why = found
    if step is None:
        return RestorePlan(None, why)
    if disk_step is not None and disk_step > step:
        return RestorePlan(
            None, f"the disk checkpoint of step {disk_step} is newer than the live step {step}"
        )
    sources: dict[int, tuple[str, int | None]] = {}
    for rank in range(world):
        key = shard_key(rank, world) if sharded else REPLICATED
        givers = sorted(holders[Held(key, step)])
        sources[rank] = (key, None if rank in givers else givers[0])
    return RestorePlan(step, f"step {step} is live", sources)


def _newest_sharded(holders: dict[Held, list[int]], world: int) -> tuple[int | None, str]:
    """The newest step every shard of a ``world``-rank world is held at, and why none."""
    by_step: dict[int, set[int]] = {}
    other_worlds: set[int] = set()
    for snapshot in holders:
        match = _SHARD.match(snapshot.key)
        if match is None:
            continue
        index, size = int(match.group(1)), int(match.group(2))
        if size != world:
            other_worlds.add(size)
            continue
        by_step.setdefault(snapshot.step, set()).add(index)
    complete = [step for step, shards in by_step.items() if shards == set(range(world))]
    if complete:
        return max(complete), ""
    if by_step:
        newest = max(by_step)
        missing = sorted(set(range(world)) - by_step[newest])
        return None, f"no step has every shard live (step {newest} lacks shards {missing})"
    if other_worlds:
        sizes = ", ".join(str(size) for size in sorted(other_worlds))
        return None, (
            f"the live shards were cut for {sizes} rank(s), not {world}: re-sharding "
            "from live copies is not supported"
        )
    return None, "no rank holds a live snapshot"
