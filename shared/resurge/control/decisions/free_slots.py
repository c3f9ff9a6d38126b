"""Free slots on schedulable nodes, kept bucketed by how many are free: pure, no I/O.

A :class:`Pool` answers "the node with the most free slots that fits ``nproc``, in one
of these topology groups if any fits, not one of these avoided nodes" in time bounded
by the number of distinct free amounts, not the number of nodes, so a decision over
thousands of nodes stays fast. Every :meth:`Pool.take` has an exact inverse,
:meth:`Pool.give`, which lets a caller try a placement and undo it. Nodes the pool does
not know (unschedulable or gone) are ignored by both: their slots are never offered.
Among nodes with equally many free slots the one that entered that amount first wins,
so answers are deterministic for a given input order.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

__all__ = ["Group", "Pool"]

Group = tuple[str, ...]
"""A node's topology group: its values of the topology label keys, in their order."""

_Buckets = list[dict[str, None]]


class Pool:
    """Free slots per schedulable node, bucketed by amount, overall and per group."""

    def __init__(self, free: dict[str, int], group_of: Callable[[str], Group], top: int) -> None:
        """``free``: free slots of each schedulable node (it is kept and updated);
        ``group_of``: a node's topology group; ``top``: the most slots any node has."""
        self.top = max(top, 0)
        self.free = free
        self.group_of = group_of
        self.total = 0
        self._all: _Buckets = [{} for _ in range(self.top + 1)]
        self._groups: dict[Group, _Buckets] = {}
        self._of: dict[str, _Buckets] = {}
        for name, amount in free.items():
            if amount > 0:
                self._enter(name, amount)
                self.total += amount

    def _group_buckets(self, name: str) -> _Buckets:
        buckets = self._of.get(name)
        if buckets is None:
            group = self.group_of(name)
            buckets = self._groups.get(group)
            if buckets is None:
                buckets = self._groups[group] = [{} for _ in range(self.top + 1)]
            self._of[name] = buckets
        return buckets

    def _enter(self, name: str, amount: int) -> None:
        at = min(amount, self.top)
        self._all[at][name] = None
        self._group_buckets(name)[at][name] = None

    def _leave(self, name: str, amount: int) -> None:
        at = min(amount, self.top)
        del self._all[at][name]
        del self._group_buckets(name)[at][name]

    def _set(self, name: str, amount: int) -> None:
        old = self.free[name]
        if old > 0:
            self._leave(name, old)
        if amount > 0:
            self._enter(name, amount)
        self.total += max(amount, 0) - max(old, 0)
        self.free[name] = amount

    def take(self, name: str, slots: int) -> None:
        """Mark ``slots`` of ``name`` taken (a node the pool does not know: nothing)."""
        if name in self.free:
            self._set(name, self.free[name] - slots)

    def give(self, name: str, slots: int) -> None:
        """Mark ``slots`` of ``name`` free again: the inverse of :meth:`take`."""
        if name in self.free:
            self._set(name, self.free[name] + slots)

    def capacity(self, group: Group, nproc: int) -> int:
        """How many worker groups of ``nproc`` slots fit in ``group`` now."""
        buckets = self._groups.get(group)
        if buckets is None or nproc > self.top:
            return 0
        return sum(len(buckets[f]) * (f // nproc) for f in range(nproc, self.top + 1))

    def roomiest_group(self, nproc: int) -> Group | None:
        """The group that holds the most worker groups of ``nproc`` slots; None if none
        holds one."""
        best, most = None, 0
        for group in self._groups:
            room = self.capacity(group, nproc)
            if room > most:
                best, most = group, room
        return best

    def pick(self, nproc: int, prefer: Sequence[Group], avoid: Collection[str]) -> str | None:
        """The node with the most free slots (at least ``nproc``) in the first group of
        ``prefer`` that has one, else anywhere; never one in ``avoid``. None if none fits."""
        if self.total < nproc or nproc > self.top:
            return None
        for group in prefer:
            buckets = self._groups.get(group)
            found = None if buckets is None else _best(buckets, nproc, avoid)
            if found is not None:
                return found
        return _best(self._all, nproc, avoid)

    def place(
        self, nproc: int, count: int, prefer: Sequence[Group], avoid: Collection[str]
    ) -> list[str]:
        """Take room for up to ``count`` worker groups of ``nproc`` slots, one at a time
        by :meth:`pick`; each placed node's group joins the preferred ones, so replicas
        stay together. Returns the nodes taken, in order (fewer than ``count`` when the
        rest does not fit; the caller gives them back if it wants all or nothing)."""
        groups = list(prefer)
        placed: list[str] = []
        while len(placed) < count:
            name = self.pick(nproc, groups, avoid)
            if name is None:
                break
            self.take(name, nproc)
            placed.append(name)
            group = self.group_of(name)
            if group not in groups:
                groups.append(group)
        return placed

    def give_all(self, names: Iterable[str], slots: int) -> None:
        """:meth:`give` ``slots`` on each of ``names``."""
        for name in names:
            self.give(name, slots)

    def take_all(self, names: Iterable[str], slots: int) -> None:
        """:meth:`take` ``slots`` on each of ``names``."""
        for name in names:
            self.take(name, slots)


def _best(buckets: _Buckets, nproc: int, avoid: Collection[str]) -> str | None:
    for amount in range(len(buckets) - 1, nproc - 1, -1):
        for name in buckets[amount]:
            if name not in avoid:
                return name
    return None
