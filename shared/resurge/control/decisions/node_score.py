"""A node's score and its quarantine (a pure change of its health record).

Every fault the attribution table counts against a node
(:mod:`resurge.control.decisions.node_attribution`) adds its weight to the node's score;
the score halves every ``half_life_hours``, so a node that faulted long ago is trusted
again. Faults on the same node within :data:`INCIDENT_SECONDS` of each other are one
incident, counted at the highest weight among them, unless they name different GPUs: one
cause faults every job on the node at once, and shows more than once (an XID, the ECC
count it raised, the node then reported unhealthy). Once the score reaches
``threshold`` the node is quarantined: cordoned for new work, the jobs on it moved off
at their next checkpoint; in ``dry-run`` mode the quarantine is only recorded and
reported; ``off`` scores without quarantining. A quarantine ends by an operator's word
(``resurge node uncordon``), which also clears the score (the node was repaired), or by
a health check the node passed (:func:`release_after_check`), which lowers the score to
half the threshold: a node that keeps failing is quarantined again sooner.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from resurge.control.decisions.node_attribution import Attribution
from resurge.control.state.node_health import (
    INCIDENTS_KEPT,
    NodeHealth,
    NodeIncident,
    Quarantine,
    Release,
)
from resurge.events import FaultDetected
from resurge.runtime.settings import Settings

__all__ = [
    "INCIDENT_SECONDS",
    "NodePolicy",
    "apply_incident",
    "current_score",
    "release",
    "release_after_check",
]

INCIDENT_SECONDS = 5.0

QuarantineMode = Literal["enforce", "dry-run", "off"]


@dataclass(frozen=True)
class NodePolicy:
    """The cluster's quarantine settings."""

    mode: QuarantineMode = "enforce"
    threshold: float = 2.5
    half_life_hours: float = 24.0

    @classmethod
    def of(cls, settings: Settings) -> NodePolicy:
        """The policy the cluster's settings say (``RESURGE_NODE_QUARANTINE`` ...)."""
        return cls(
            mode=settings.node_quarantine,
            threshold=settings.node_quarantine_score,
            half_life_hours=settings.node_score_half_life_hours,
        )


def current_score(record: NodeHealth, now: datetime, policy: NodePolicy) -> float:
    """The record's score decayed to ``now``."""
    if record.score_at is None or record.score == 0:
        return 0.0
    hours = max(0.0, (now - record.score_at).total_seconds() / 3600)
    return float(record.score * 0.5 ** (hours / policy.half_life_hours))


def apply_incident(
    record: NodeHealth,
    fault: FaultDetected,
    counted: Attribution,
    now: datetime,
    policy: NodePolicy,
) -> bool:
    """Count ``fault`` (attributed as ``counted``) against the node, and quarantine it if
    its score reaches the threshold. True if anything changed."""
    window = timedelta(seconds=INCIDENT_SECONDS)
    gpu = fault.evidence.get("gpu")
    gpu = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None
    for index in range(len(record.incidents) - 1, -1, -1):
        incident = record.incidents[index]
        if incident.fault_id == fault.fault_id:
            return False
        other_gpu = gpu is not None and incident.gpu is not None and incident.gpu != gpu
        if abs(fault.time - incident.time) <= window and not other_gpu:
            if counted.weight <= incident.weight:
                return False  # the same incident, counted already
            raised = counted.weight - incident.weight
            record.score = round(current_score(record, now, policy) + raised, 6)
            record.score_at = now
            record.incidents[index] = incident.model_copy(
                update={"rule": counted.rule, "weight": counted.weight}
            )
            score = record.score
            break
    else:
        score = current_score(record, now, policy) + counted.weight
        record.score, record.score_at = round(score, 6), now
        record.counted += 1
        record.incidents = [
            *record.incidents,
            NodeIncident(
                time=fault.time,
                fault_id=fault.fault_id,
                reason=fault.reason,
                rule=counted.rule,
                weight=counted.weight,
                job=fault.job,
                gpu=gpu,
                message=fault.message[:300],
            ),
        ][-INCIDENTS_KEPT:]
    if record.quarantine is None and policy.mode != "off" and score >= policy.threshold:
        record.quarantine = Quarantine(
            since=now,
            score=round(score, 3),
            threshold=policy.threshold,
            why=_why(record, now, policy),
            dry_run=policy.mode == "dry-run",
        )
    return True


def _why(record: NodeHealth, now: datetime, policy: NodePolicy) -> str:
    """The incidents that still weigh, in words: "3 x xid_takes_gpu_out (jobs a, b)"."""
    horizon = now - timedelta(hours=policy.half_life_hours * 4)
    counts: dict[str, int] = {}
    jobs: dict[str, set[str]] = {}
    for incident in record.incidents:
        if incident.time >= horizon:
            counts[incident.rule] = counts.get(incident.rule, 0) + 1
            if incident.job:
                jobs.setdefault(incident.rule, set()).add(incident.job)
    parts = []
    for rule, count in sorted(counts.items(), key=lambda kv: -kv[1]):
        on = sorted(jobs.get(rule, ()))
        parts.append(f"{count} x {rule}" + (f" (jobs {', '.join(on)})" if on else ""))
    return "; ".join(parts)


def release(record: NodeHealth, now: datetime, by: str, why: str = "") -> bool:
    """End the node's quarantine (an operator's word: it was repaired) and clear its
    score. True if it was quarantined."""
    if record.quarantine is None:
        return False
    record.quarantine = None
    record.score, record.score_at = 0.0, now
    record.last_release = Release(time=now, by=by, why=why)
    return True


def release_after_check(
    record: NodeHealth, now: datetime, checked: datetime, why: str, policy: NodePolicy
) -> bool:
    """End the node's quarantine after a health check it passed at ``checked`` (``why``:
    what the check found), its score lowered to half the threshold (kept if lower).
    True if released: a quarantine, not a dry run's, that began before the check."""
    held = record.quarantine
    if held is None or held.dry_run or checked < held.since:
        return False
    record.quarantine = None
    record.score = min(current_score(record, now, policy), policy.threshold / 2)
    record.score_at = now
    record.last_release = Release(time=now, by="health_check", why=why[:300])
    return True
