"""A node's fault record across jobs, as ``resurge node describe`` and ``node list`` show it.

:func:`score_view` is what ``node list`` adds to a node: its score decayed to now and
its quarantine (None when it has none). :func:`record_view` is ``node describe``'s: the
same, with the threshold, half-life and mode of the policy, the incidents counted (newest
first), and how its last quarantine ended. A node with no health record (no fault ever
counted against it) scores 0. :func:`read_records` and :func:`read_record` read the
records (:mod:`resurge.control.state.node_health`) off the bus: none while no restarter
has made their bucket. The policy is the one the reader's settings give
(:meth:`~resurge.control.decisions.node_score.NodePolicy.of`); a quarantine keeps the
threshold it was decided at.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from resurge.control.decisions.node_score import NodePolicy, current_score
from resurge.control.state.node_health import NodeHealth, NodeHealthStore, Quarantine
from resurge.runtime.bus import Bus

__all__ = ["read_record", "read_records", "record_view", "score_view"]


async def _store(bus: Bus) -> NodeHealthStore | None:
    kv = await bus.node_health_bucket(create=False)
    return None if kv is None else NodeHealthStore(kv)


async def read_records(bus: Bus) -> dict[str, NodeHealth]:
    """Every node's health record on ``bus``, by node name."""
    store = await _store(bus)
    return {} if store is None else {r.name: r for r in await store.all()}


async def read_record(bus: Bus, name: str) -> NodeHealth | None:
    """Node ``name``'s health record on ``bus``; None where it has none."""
    store = await _store(bus)
    found = None if store is None else await store.get(name)
    return None if found is None else found[0]


def score_view(record: NodeHealth | None, now: datetime, policy: NodePolicy) -> dict[str, Any]:
    """``score`` (decayed to ``now``, 3 decimals) and ``quarantine`` (an object, or None)."""
    if record is None:
        return {"score": 0.0, "quarantine": None}
    return {
        "score": round(current_score(record, now, policy), 3),
        "quarantine": _quarantine(record.quarantine),
    }


def record_view(record: NodeHealth | None, now: datetime, policy: NodePolicy) -> dict[str, Any]:
    """:func:`score_view` with the policy (``threshold``, ``halfLifeHours``, ``mode``),
    ``counted`` (incidents in all), ``incidents`` (those kept, newest first) and
    ``lastRelease`` (an object, or None)."""
    release = None if record is None else record.last_release
    return {
        **score_view(record, now, policy),
        "threshold": policy.threshold,
        "halfLifeHours": policy.half_life_hours,
        "mode": policy.mode,
        "counted": 0 if record is None else record.counted,
        "incidents": [
            {
                "time": incident.time.isoformat(),
                "reason": incident.reason,
                "rule": incident.rule,
                "weight": incident.weight,
                "job": incident.job,
                "message": incident.message,
                "faultId": incident.fault_id,
            }
            for incident in reversed(record.incidents if record is not None else [])
        ],
        "lastRelease": None
        if release is None
        else {"time": release.time.isoformat(), "by": release.by, "why": release.why},
    }


def _quarantine(held: Quarantine | None) -> dict[str, Any] | None:
    if held is None:
        return None
    return {
        "since": held.since.isoformat(),
        "score": held.score,
        "threshold": held.threshold,
        "why": held.why,
        "dryRun": held.dry_run,
        "jobs": list(held.jobs),
    }
