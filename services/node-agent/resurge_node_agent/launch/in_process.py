"""The agent's half of an in-process restart: who can take one, and who has confirmed.

:func:`restartable_workers` decides whether every local worker of the running group
can be restarted in-process: alive, connected to the agent's channel from that very
process, and running under ``resurge.worker.restartable`` (its hello said
``in_process``). It returns their process ids, or the reason it cannot.

:class:`Rejoins` collects the confirmations of one restart: each local rank's
``rejoining`` for the new generation. :meth:`Rejoins.wait` returns None once every
rank confirmed, or the reason it did not: the deadline passed (naming the ranks still
missing), or :meth:`Rejoins.fail` was called (a worker exited meanwhile).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from resurge.worker.wire import Hello

__all__ = ["Rejoins", "restartable_workers"]


def restartable_workers(
    nproc: int,
    pid_of: Callable[[int], int | None],
    worker: Callable[[int, int], Hello | None],
) -> dict[int, int] | str:
    """Local rank -> pid of every worker, if all can restart in-process; else why not."""
    pids: dict[int, int] = {}
    for local_rank in range(nproc):
        pid = pid_of(local_rank)
        if pid is None:
            return f"local rank {local_rank} is not running"
        hello = worker(local_rank, pid)
        if hello is None:
            return f"local rank {local_rank} (pid {pid}) is not connected to the agent"
        if not hello.in_process:
            return f"local rank {local_rank} does not run under resurge.worker.restartable"
        pids[local_rank] = pid
    return pids


class Rejoins:
    """The local ranks still to confirm one in-process restart to ``generation``."""

    def __init__(self, generation: int, local_ranks: Iterable[int]) -> None:
        self.generation = generation
        self.missing = set(local_ranks)
        self._failure: str | None = None
        self._settled = asyncio.Event()
        if not self.missing:
            self._settled.set()

    def confirm(self, local_rank: int, generation: int) -> None:
        """Worker ``local_rank`` said it is rejoining as ``generation``."""
        if generation == self.generation:
            self.missing.discard(local_rank)
            if not self.missing:
                self._settled.set()

    def fail(self, why: str) -> None:
        """Give up on the restart: :meth:`wait` returns ``why`` unless all ranks confirmed."""
        if self._failure is None:
            self._failure = why
        self._settled.set()

    async def wait(self, seconds: float) -> str | None:
        """None when every rank confirmed within ``seconds``, else why not."""
        try:
            await asyncio.wait_for(self._settled.wait(), seconds)
        except TimeoutError:
            ranks = ", ".join(str(rank) for rank in sorted(self.missing))
            return f"local ranks {ranks} did not rejoin within {seconds:g} s"
        if self.missing:
            return self._failure or "the restart was abandoned"
        return None
