"""Failures of many independent nodes as one superposed Poisson process.

Each node fails by each kind at a constant rate, independently. Rather than a clock per
node, :class:`FailureStream` draws candidates of the superposition of every node and
kind (rate: nodes times the sum of the kinds' rates), each on a node and of a kind
drawn uniformly and by rate; the caller rejects a candidate that cannot happen (its node
is away for repair; a process fault where no process runs). That is exact thinning, so
the accepted failures are the per-node processes, at a cost per failure, not per node or
per tick. The stream depends only on its seed and sizes, never on what the caller does
with it: every policy run with one seed meets the same candidates.

With ``weights`` (one per node: a rate multiplier, :mod:`.node_health`), a kind that
counts against its node fails on node ``i`` at its rate times ``weights[i]``: its
candidates' nodes are drawn by weight; other kinds' stay uniform. Without, the stream is
the same draw for draw as it always was.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from resurge.simulation.config import FailureKind

__all__ = ["Candidate", "FailureStream", "per_node_second"]

_SECONDS_PER_1000_DAYS = 1_000 * 86_400.0


def per_node_second(kind: FailureKind, scale: float = 1.0) -> float:
    """``kind``'s failures per node per second."""
    return kind.per_1000_node_days / _SECONDS_PER_1000_DAYS * scale


@dataclass(frozen=True, slots=True)
class Candidate:
    """A would-be failure: when, which node (an index), of which kind, on which GPU."""

    time: float
    node: int
    kind: str
    gpu: int


class FailureStream:
    """Candidates of ``nodes`` nodes' failures, in time order, from ``seed``; with
    ``weights``, per-node rates for the kinds that count against a node (the module)."""

    def __init__(
        self,
        kinds: Mapping[str, FailureKind],
        nodes: int,
        gpus_per_node: int,
        *,
        scale: float = 1.0,
        seed: int = 0,
        weights: Sequence[float] | None = None,
    ) -> None:
        self.names = [name for name, kind in kinds.items() if kind.per_1000_node_days > 0]
        self.nodes = nodes
        self.gpus = gpus_per_node
        self.rng = random.Random(seed)
        self.weighted: frozenset[str] = frozenset()
        self.node_cumulative: list[float] = []
        if weights is None:
            rates = [per_node_second(kinds[name], scale) for name in self.names]
            self.cumulative = list(itertools.accumulate(rates))
            self.rate = nodes * (self.cumulative[-1] if self.cumulative else 0.0)
            return
        if len(weights) != nodes:
            raise ValueError(f"{len(weights)} weights for {nodes} nodes")
        self.weighted = frozenset(n for n in self.names if kinds[n].counts_against_node)
        self.node_cumulative = list(itertools.accumulate(weights))
        total = self.node_cumulative[-1] if self.node_cumulative else 0.0
        # each kind's rate over the whole fleet
        fleet = [
            per_node_second(kinds[n], scale) * (total if n in self.weighted else nodes)
            for n in self.names
        ]
        self.cumulative = list(itertools.accumulate(fleet))
        self.rate = self.cumulative[-1] if self.cumulative else 0.0

    def after(self, now: float) -> Candidate | None:
        """The next candidate after ``now`` (None when nothing ever fails)."""
        if self.rate <= 0:
            return None
        rng = self.rng
        time = now + rng.expovariate(self.rate)
        if self.node_cumulative:
            return self._weighted(time)
        node = rng.randrange(self.nodes)
        pick = rng.random() * self.cumulative[-1]
        kind = self.names[min(bisect.bisect_right(self.cumulative, pick), len(self.names) - 1)]
        return Candidate(time=time, node=node, kind=kind, gpu=rng.randrange(self.gpus))

    def _weighted(self, time: float) -> Candidate:
        rng = self.rng
        pick = rng.random() * self.cumulative[-1]
        kind = self.names[min(bisect.bisect_right(self.cumulative, pick), len(self.names) - 1)]
        if kind in self.weighted:
            cumulative = self.node_cumulative
            at = bisect.bisect_right(cumulative, rng.random() * cumulative[-1])
            node = min(at, self.nodes - 1)
        else:
            node = rng.randrange(self.nodes)
        return Candidate(time=time, node=node, kind=kind, gpu=rng.randrange(self.gpus))
