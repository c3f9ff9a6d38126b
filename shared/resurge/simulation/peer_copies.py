"""Which live copies of a job's state one recovery leaves: resume from memory or from disk.

A job with protected state snapshots it every step into each replica's node memory (the
worker group's folder, which goes with the worker group). :class:`PeerCopies` follows,
for one recovery (from the fault that stops training until it trains again), which
replicas' memory is gone: a replica whose node is lost, whose worker group a restart
recreates (the ``pod`` rung; every group at ``job``), which moves to another node, or
which is released (a requeue, a failed job). :meth:`PeerCopies.complete` says whether
some copy of every part of the state is left, so that the restart resumes from the
newest live step rather than from the disk checkpoint:

- ``replicated`` (DDP): every replica holds the whole state; it is gone only when every
  replica's memory is;
- ``sharded`` (FSDP, ZeRO): replica ``r`` holds its shard and a buddy copy of replica
  ``r - 1``'s (a ring across nodes, one replica per node); shard ``r`` is gone when
  replica ``r`` and its buddy ``r + 1`` are both lost in the same recovery.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["PeerCopies"]


class PeerCopies:
    """The replicas whose memory one recovery lost, out of ``replicas``."""

    def __init__(self, state: Literal["replicated", "sharded"], replicas: int) -> None:
        self.state = state
        self.replicas = replicas
        self.lost: set[int] = set()
        self.everything_lost = False

    def lose(self, replica: int) -> None:
        """``replica``'s memory is gone (its node, its worker group, or it moved)."""
        self.lost.add(replica)

    def lose_all(self) -> None:
        """Every replica's memory is gone (every worker group recreated or released)."""
        self.everything_lost = True

    def complete(self) -> bool:
        """Whether every part of the state still has a live copy."""
        if self.everything_lost or len(self.lost) >= self.replicas:
            return False
        if self.state == "replicated":
            return True
        return not any((r + 1) % self.replicas in self.lost for r in self.lost)

    def any_lost(self) -> bool:
        """Whether some replica must fetch its state from a peer."""
        return self.everything_lost or bool(self.lost)

    def start_over(self) -> None:
        """Training runs again: every replica holds (and snapshots) the state anew."""
        self.lost.clear()
        self.everything_lost = False
