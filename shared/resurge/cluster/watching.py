"""A backend's watch as a context manager: its watchers stopped when the block ends.

``async with watching(backend, node) as changes:`` iterates
:meth:`~resurge.cluster.protocol.ClusterBackend.watch` and closes the iterator on the
way out, however the block ends (a watch never ends by itself).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from resurge.cluster.protocol import ClusterBackend, ClusterChange

__all__ = ["watching"]


@asynccontextmanager
async def watching(
    backend: ClusterBackend, node: str | None = None
) -> AsyncIterator[AsyncIterator[ClusterChange]]:
    """``backend.watch(node)``, closed (its watchers stopped) when the block ends."""
    changes = backend.watch(node)
    try:
        yield changes
    finally:
        aclose = getattr(changes, "aclose", None)
        if aclose is not None:
            await aclose()
