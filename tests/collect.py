"""A collector of bus events that tests can wait on (instead of sleeping)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from resurge.events import Envelope, Event

__all__ = ["Events"]

E = TypeVar("E", bound=Envelope)


class Events:
    """Events in arrival order; ``add`` is a ``Bus.subscribe`` handler."""

    def __init__(self) -> None:
        self.items: list[Event] = []
        self._changed = asyncio.Condition()

    async def add(self, event: Event, _subject: str) -> None:
        async with self._changed:
            self.items.append(event)
            self._changed.notify_all()

    async def wait_for(self, test: Callable[[list[Event]], Any], seconds: float = 20) -> Any:
        """Wait until ``test(items)`` is truthy; return that value."""
        found: list[Any] = []

        def check() -> bool:
            found[:] = [test(self.items)]
            return bool(found[0])

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(check), seconds)
        return found[0]

    def of(self, kind: type[E]) -> list[E]:
        """The events of type ``kind``, in arrival order."""
        return [e for e in self.items if isinstance(e, kind)]
