"""Nodes that keep failing: per-node rates with a few bad nodes, and each node's record.

:func:`rate_multipliers` gives each node a rate multiplier for the failure kinds that
count against a node (``failures.<kind>.counts_against_node``): ``cluster.bad_nodes``'s
``fraction`` of the nodes fail ``rate_multiplier`` times as often as the rest. The bad
nodes are drawn from the seed, as evenly as rounding allows among the job's first nodes
and the rest (so the job starts on its share of them), and the good nodes' multiplier is
set so that the fleet's mean is exactly 1: the config's rates stay the fleet's mean, and
a fleet with bad nodes fails as often in all as the uniform one.

:class:`NodeHealth` is what a policy knows and does about nodes in one run. Each fault
attributed to a node raises its score by 1; the score halves every ``half_life_hours``
(the product's shape: a per-node score with exponential decay); at ``threshold`` the node
is quarantined (:meth:`NodeHealth.fault` says so; in ``dry_run`` it only counts). A
quarantined node comes back after its health check truly fixed with
``fixed_probability`` (it fails as a good node from then on), else as bad as before,
its score cleared either way (:meth:`NodeHealth.returned`). A node whose rate fell keeps
its candidates from the failure stream, drawn at its first rate, with the ratio of its
rates (:meth:`NodeHealth.accepts`): exact thinning, so the stream stays the same for
every policy. With proactive moves, :meth:`NodeHealth.predicted` says whether warning
signs announced a fault. Its own random draws come from its own generator.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

from resurge.simulation.config import BadNodes, FailureKind, QuarantineConfig

__all__ = ["NodeHealth", "rate_multipliers"]


def rate_multipliers(nodes: int, job_nodes: int, bad: BadNodes | None, seed: int) -> list[float]:
    """Each node's rate multiplier, mean exactly 1 (see the module); all 1 without
    ``bad`` or where rounding leaves no bad node. ``job_nodes``: the job's first nodes
    (0 to ``job_nodes - 1``), among which the bad nodes are spread evenly."""
    if bad is None:
        return [1.0] * nodes
    rng = random.Random(f"bad-nodes-{seed}")
    rest = nodes - job_nodes
    chosen = rng.sample(range(job_nodes), round(bad.fraction * job_nodes))
    chosen += rng.sample(range(job_nodes, nodes), round(bad.fraction * rest))
    if not chosen:
        return [1.0] * nodes
    good = nodes / (nodes - len(chosen) + len(chosen) * bad.rate_multiplier)
    out = [good] * nodes
    for node in chosen:
        out[node] = good * bad.rate_multiplier
    return out


class NodeHealth:
    """One run's per-node rates, scores and quarantines (see the module)."""

    def __init__(
        self,
        multipliers: Sequence[float],
        quarantine: QuarantineConfig | None,
        *,
        proactive: bool,
        seed: int,
    ) -> None:
        self.first = list(multipliers)
        self.rate = list(multipliers)
        self.good = min(multipliers, default=1.0)
        self.bad = {i for i, m in enumerate(multipliers) if m > self.good}
        self.quarantine = quarantine
        self.proactive = proactive
        self.rng = random.Random(f"node-health-{seed}")
        self.score: dict[int, float] = {}
        self.stamp: dict[int, float] = {}
        self.quarantined: set[int] = set()
        self.would: set[int] = set()
        self.counts: Counter[str] = Counter()
        """attributed_faults, on_bad_nodes, quarantines, quarantined_bad, returned_fixed,
        predicted, planned_moves, would_quarantine (dry run: distinct nodes)."""

    def accepts(self, node: int) -> bool:
        """Whether a candidate on ``node``, drawn at its first rate, happens at its rate
        now."""
        now, first = self.rate[node], self.first[node]
        return now >= first or self.rng.random() * first < now

    def predicted(self, kind: FailureKind) -> bool:
        """Whether warning signs announced this fault of ``kind`` (proactive policies)."""
        if not self.proactive or kind.predictable_fraction <= 0:
            return False
        return self.rng.random() < kind.predictable_fraction

    def score_of(self, node: int, now: float) -> float:
        """``node``'s score at ``now`` (seconds)."""
        if node not in self.score or self.quarantine is None:
            return 0.0
        half_life = self.quarantine.half_life_hours * 3600.0
        return self.score[node] * math.pow(0.5, (now - self.stamp[node]) / half_life)

    def fault(self, now: float, node: int) -> bool:
        """A fault attributed to ``node`` at ``now``: its score rises; True when the node
        is to be quarantined now."""
        self.counts["attributed_faults"] += 1
        if node in self.bad and self.rate[node] > self.good:
            self.counts["on_bad_nodes"] += 1
        q = self.quarantine
        if q is None:
            return False
        self.score[node] = self.score_of(node, now) + 1.0
        self.stamp[node] = now
        if self.score[node] < q.threshold or node in self.quarantined:
            return False
        if q.dry_run:
            self.would.add(node)
            self.counts["would_quarantine"] = len(self.would)
            return False
        self.quarantined.add(node)
        self.counts["quarantines"] += 1
        if self.rate[node] > self.good:
            self.counts["quarantined_bad"] += 1
        return True

    def returned(self, node: int) -> None:
        """``node`` is back from quarantine after its health check (see the module)."""
        self.quarantined.discard(node)
        self.score.pop(node, None)
        self.stamp.pop(node, None)
        q = self.quarantine
        if q is not None and self.rng.random() < q.fixed_probability:
            if self.rate[node] > self.good:
                self.counts["returned_fixed"] += 1
            self.rate[node] = self.good
