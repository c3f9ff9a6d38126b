"""The node's memory of a job's protected state: snapshot files in a tmpfs folder.

The launch agent gives its worker group a folder in ``/dev/shm`` (``RESURGE_SNAPSHOT_DIR``),
its own for the group's life: a worker process that dies leaves its snapshots there for
the next one (process and in-process restarts), and the folder goes with the group
(a pod recreated, a node lost: the memory is gone, as on a real machine). Inside it,
``<key>/step-<8 digits>.snap`` is the snapshot of ``key``'s state (``replicated``, or
one shard) after that step (:mod:`resurge.worker.snapshot_format`). A file appears whole
(written aside, then renamed) or not at all, and only the newest :data:`KEEP` of a key
stay. A new snapshot is written over the oldest of them, taken aside first (its memory
pages reused, not freed and allocated again), so while step N is written steps N - 1 and
N - 2 stay whole: a rank whose write of N - 1 was still in flight when its group died
leaves N - 2, which its peers still hold too. A node's memory holds at most
:data:`KEEP` snapshots of each key, the one being written included.

Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from resurge.worker.live_copy import Held

__all__ = ["KEEP", "MEMORY_ROOT", "OverBudget", "SnapshotFolder", "node_memory"]

KEEP = 3
MEMORY_ROOT = Path("/dev/shm/resurge")


def node_memory(node: str, state_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder that stands for ``node``'s memory: ``/dev/shm/resurge/<node>`` (a pod's
    own ``/dev/shm`` on Kubernetes); on a local cluster, whose nodes share this machine's,
    one of ``/dev/shm/resurge-<cluster>/`` per node, where ``<cluster>`` stands for the
    cluster's state folder ``state_dir``, so that a node powered off loses its own."""
    if state_dir is None:
        return MEMORY_ROOT / node
    cluster = hashlib.sha256(os.fsencode(Path(state_dir).resolve())).hexdigest()[:12]
    return MEMORY_ROOT.with_name(f"resurge-{cluster}") / node


_NAME = re.compile(r"^step-(\d{8,})\.snap$")


class OverBudget(OSError):
    """A snapshot that would take the folder past its memory budget."""


class SnapshotFolder:
    """Snapshot files under ``root`` (see the module docstring), taking at most
    ``budget`` bytes in all (None: no budget of its own)."""

    def __init__(self, root: str | os.PathLike[str], budget: int | None = None) -> None:
        self.root = Path(root)
        self.budget = budget

    def path(self, key: str, step: int) -> Path:
        """Where the snapshot of ``key`` at ``step`` lies (whether or not it does)."""
        return self.root / key / f"step-{step:08d}.snap"

    def held(self) -> list[Held]:
        """Every whole snapshot here, oldest first."""
        found = []
        if not self.root.is_dir():
            return []
        for keyed in self.root.iterdir():
            if not keyed.is_dir():
                continue
            for file in keyed.iterdir():
                match = _NAME.match(file.name)
                if match:
                    found.append(Held(keyed.name, int(match.group(1))))
        return sorted(found, key=lambda held: (held.step, held.key))

    def write(
        self, key: str, step: int, save: Callable[[Path], object], size: int | None = None
    ) -> Path:
        """Have ``save`` write the snapshot of ``key`` at ``step`` aside, over the oldest
        of ``key``'s when it has :data:`KEEP` (``save`` overwrites whatever the file
        holds), then put it in place and drop all but the newest :data:`KEEP`.

        With a budget, ``size`` (the file's size, known before it is written) must fit:
        older snapshots of ``key`` are dropped first, down to its newest one, and
        :class:`OverBudget` is raised, nothing written, when it still does not."""
        final = self.path(key, step)
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        aside = final.with_name(f".{final.name}.{os.getpid()}.part")
        steps = sorted(h.step for h in self.held() if h.key == key and h.step != step)
        if len(steps) >= KEEP:
            with contextlib.suppress(FileNotFoundError):  # another writer's prune
                self.path(key, steps.pop(0)).replace(aside)
        if self.budget is not None:
            self._make_room(key, steps, aside, size)
        try:
            save(aside)
            aside.replace(final)
        finally:
            aside.unlink(missing_ok=True)
        self.prune(key)
        self._drop_other_worlds(key, step)
        return final

    def _drop_other_worlds(self, key: str, step: int) -> None:
        """Once ``key`` (cut for a world of n ranks) is written at ``step``, drop the
        keys cut for another world size whose newest step is before ``step - 2``: every
        rank of this world holds ``step - 2`` whole by then (each rank's write of a step
        ends before its optimizer's step after next), so they can never be the newest
        complete state again (what a resize left behind)."""
        world = _world_of(key)
        if world is None:
            return
        others = [h for h in self.held() if _world_of(h.key) not in (None, world)]
        newest: dict[str, int] = {}
        for held in others:  # oldest first: the last one seen of a key is its newest
            newest[held.key] = held.step
        for held in others:
            if newest[held.key] < step - 2:
                self.path(held.key, held.step).unlink(missing_ok=True)

    def used(self, besides: Path | None = None) -> int:
        """Bytes the folder's files take now, ``besides`` not counted."""
        total = 0
        for keyed in self.root.iterdir() if self.root.is_dir() else []:
            for file in keyed.iterdir() if keyed.is_dir() else []:
                if file != besides:
                    with contextlib.suppress(FileNotFoundError):
                        total += file.stat().st_size
        return total

    def _make_room(self, key: str, steps: list[int], aside: Path, size: int | None) -> None:
        """Drop ``key``'s oldest snapshots (of ``steps``, oldest first) but its newest
        until ``size`` bytes fit in the budget beside the rest; raise if they cannot."""
        assert self.budget is not None
        if size is None:
            raise ValueError("a folder with a budget needs each snapshot's size first")
        used = self.used(besides=aside)  # the file taken aside is written over
        while used + size > self.budget and len(steps) > 1:
            dropped = self.path(key, steps.pop(0))
            with contextlib.suppress(FileNotFoundError):
                used -= dropped.stat().st_size
                dropped.unlink()
        if used + size > self.budget:
            aside.unlink(missing_ok=True)
            raise OverBudget(
                f"{size} bytes do not fit in the snapshot memory budget of {self.budget} "
                f"bytes ({used} bytes in use in {self.root})"
            )

    def drop_after(self, step: int | None) -> list[Held]:
        """Drop every snapshot of a step after ``step`` (None: every snapshot): what a
        generation that resumed from ``step`` will never go back to. The dropped ones."""
        dropped = [h for h in self.held() if step is None or h.step > step]
        for held in dropped:
            self.path(held.key, held.step).unlink(missing_ok=True)
        return dropped

    def sweep(self) -> list[Path]:
        """Remove the half-written files of processes that are gone (a write killed with
        its rank); the removed ones."""
        swept = []
        for part in self.root.glob("*/.step-*.snap.*.part") if self.root.is_dir() else []:
            writer = part.name.rsplit(".", 2)[-2]
            if writer.isdigit() and not _alive(int(writer)):
                part.unlink(missing_ok=True)
                swept.append(part)
        return swept

    def prune(self, key: str) -> None:
        """Drop all but the newest :data:`KEEP` snapshots of ``key``."""
        steps = sorted(h.step for h in self.held() if h.key == key)
        for step in steps[:-KEEP]:
            self.path(key, step).unlink(missing_ok=True)


_CUT = re.compile(r"^(?:shard|rng)-\d+-of-(\d+)$")


def _world_of(key: str) -> int | None:
    """The world size a key was cut for (``shard-<i>-of-<n>``, ``rng-<i>-of-<n>``)."""
    match = _CUT.match(key)
    return int(match.group(1)) if match else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
