"""Lines waiting to be sent to the agent: ordered, thread-safe, bounded where it may be.

Droppable lines (progress: each one supersedes the last) are capped at
``max_droppable``; one more drops the oldest of them, and :attr:`Outbox.dropped`
counts it. Other lines (checkpoints) are never dropped: they are rare, and the agent
needs every one to find the latest checkpoint all ranks have.
"""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["Item", "Outbox"]

Item = tuple[bool, bytes]  # (droppable, line)


class Outbox:
    """Lines waiting to be sent, oldest first; at most ``max_droppable`` droppable ones."""

    def __init__(self, max_droppable: int = 1024) -> None:
        if max_droppable < 1:
            raise ValueError(f"max_droppable must be >= 1, not {max_droppable}")
        self.max_droppable = max_droppable
        self.dropped = 0
        self._items: deque[Item] = deque()
        self._droppable = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, line: bytes, *, droppable: bool) -> None:
        """Queue ``line`` last; past the cap, the oldest droppable line is dropped."""
        with self._lock:
            self._items.append((droppable, line))
            self._droppable += droppable
            self._trim()

    def take(self, max_bytes: int) -> list[Item]:
        """The oldest lines, at least one (if any) and about ``max_bytes`` at most."""
        taken: list[Item] = []
        size = 0
        with self._lock:
            while self._items and (not taken or size + len(self._items[0][1]) <= max_bytes):
                item = self._items.popleft()
                self._droppable -= item[0]
                size += len(item[1])
                taken.append(item)
        return taken

    def put_back(self, items: list[Item]) -> None:
        """Return lines :meth:`take` gave out but that were not sent, ahead of the rest."""
        with self._lock:
            self._items.extendleft(reversed(items))
            self._droppable += sum(droppable for droppable, _ in items)
            self._trim()

    def _trim(self) -> None:
        while self._droppable > self.max_droppable:
            oldest = next(i for i, (droppable, _) in enumerate(self._items) if droppable)
            del self._items[oldest]
            self._droppable -= 1
            self.dropped += 1
