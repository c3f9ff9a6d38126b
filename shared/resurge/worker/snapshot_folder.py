"""The node's memory of a job's protected state: snapshot files in a tmpfs folder.

The launch agent gives its worker group a folder in ``/dev/shm`` (``RESURGE_SNAPSHOT_DIR``),
its own for the group's life: a worker process that dies leaves its snapshots there for
the next one (process and in-process restarts), and the folder goes with the group
(a pod recreated, a node lost: the memory is gone, as on a real machine). Inside it,
``<key>/step-<8 digits>.pt`` is the snapshot of ``key``'s state (``replicated``, or one
shard) after that step. A file appears whole (written aside, then renamed) or not at
all, and only the newest :data:`KEEP` of a key stay: a rank that died mid-step leaves
the step before it, and its peers keep theirs of that step while they write the next.

Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from resurge.worker.live_copy import Held

__all__ = ["KEEP", "MEMORY_ROOT", "SnapshotFolder", "node_memory"]

KEEP = 2
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


_NAME = re.compile(r"^step-(\d{8,})\.pt$")


class SnapshotFolder:
    """Snapshot files under ``root`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, key: str, step: int) -> Path:
        """Where the snapshot of ``key`` at ``step`` lies (whether or not it does)."""
        return self.root / key / f"step-{step:08d}.pt"

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

    def write(self, key: str, step: int, save: Callable[[Path], None]) -> Path:
        """Have ``save`` write the snapshot of ``key`` at ``step`` aside, then put it in
        place and drop all but the newest :data:`KEEP` of ``key``."""
        final = self.path(key, step)
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        aside = final.with_name(f".{final.name}.{os.getpid()}.part")
        try:
            save(aside)
            aside.replace(final)
        finally:
            aside.unlink(missing_ok=True)
        self.prune(key)
        return final

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
        for part in self.root.glob("*/.step-*.pt.*.part") if self.root.is_dir() else []:
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
