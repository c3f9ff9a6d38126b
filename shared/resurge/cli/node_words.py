"""``resurge node list`` and ``node describe`` in words.

:func:`list_line` is one node of ``node list``: slots, state (and the cordon's reason),
jobs, score and quarantine, labels. :func:`describe_lines` is ``node describe``: the
same, then the score against the threshold, the quarantine (since when, why, the jobs
moved off), how the last one ended, and the faults counted against the node, newest
first. Both read the views of :mod:`resurge.control.effects.nodes` merged with those of
:mod:`resurge.control.views.node_record` (an ``inCluster`` key false for a node only a
health record knows).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["describe_lines", "list_line", "node_state", "score_words"]

# How much of a fault's message one line of the history shows.
MESSAGE_CHARS = 120


def node_state(view: Mapping[str, Any], powered_off: bool = False) -> str:
    """ready, unhealthy, cordoned (why), not reporting, or powered off (a local node
    ``resurge inject node-down`` took down: said at once, before its heartbeat runs out)."""
    if not view.get("inCluster", True):
        return "not in the cluster"
    state = "cordoned" if view["cordoned"] else "ready" if view["healthy"] else "unhealthy"
    if not view["reporting"]:
        state = "not reporting"
    if powered_off:
        state = f"powered off (`resurge node up {view['name']}`)"
    return state + (f" ({view['cordonReason']})" if view["cordonReason"] else "")


def score_words(view: Mapping[str, Any]) -> str:
    """``score: 0``, ``score: 1.25``, ``score: 3.00 (quarantined)`` or ``score: 2.60
    (would quarantine: dry run)``."""
    held = view["quarantine"]
    words = f"score: {_number(view['score'])}"
    if held is None:
        return words
    return words + (" (would quarantine: dry run)" if held["dryRun"] else " (quarantined)")


def list_line(view: Mapping[str, Any], powered_off: bool = False) -> str:
    """One node of ``resurge node list``."""
    jobs = view["jobs"]
    names = ",".join(jobs) if jobs else "-"
    labels = view["labels"]
    tags = "  labels: " + _labels(labels, ",") if labels else ""
    return (
        f"{view['name']:<16} {view['free']}/{view['slots']} free  "
        f"{node_state(view, powered_off)}  jobs: {names}  {score_words(view)}{tags}"
    )


def describe_lines(view: Mapping[str, Any], powered_off: bool = False) -> list[str]:
    """``resurge node describe``: the node, its score, quarantine, last release, history."""
    name = view["name"]
    lines = [_field("Node", name)]
    if view.get("inCluster", True):
        lines += [
            _field("Slots", f"{view['free']}/{view['slots']} free"),
            _field("State", node_state(view, powered_off)),
            _field("Jobs", ", ".join(view["jobs"]) or "none"),
            _field("Labels", _labels(view["labels"], ", ") or "none"),
        ]
    else:
        lines.append(_field("State", node_state(view)))
    lines.append(_field("Score", _score_line(view)))
    lines += _quarantine_lines(view)
    release = view["lastRelease"]
    lines.append(
        _field(
            "Last release",
            "none"
            if release is None
            else f"{_time(release['time'])} by {release['by']}"
            + (f" ({release['why']})" if release["why"] else ""),
        )
    )
    return lines + _history_lines(view)


def _score_line(view: Mapping[str, Any]) -> str:
    score = _number(view["score"])
    if view["counted"] == 0:
        score += ", no faults counted"
    half = f"halves every {view['halfLifeHours']:g} hours"
    if view["mode"] == "off":
        return f"{score} ({half}; RESURGE_NODE_QUARANTINE=off: never quarantined)"
    return (
        f"{score} (quarantine at {view['threshold']:g}, "
        f"RESURGE_NODE_QUARANTINE={view['mode']}; {half})"
    )


def _quarantine_lines(view: Mapping[str, Any]) -> list[str]:
    held = view["quarantine"]
    if held is None:
        return [_field("Quarantine", "none")]
    at = f"at score {_number(held['score'])} >= {held['threshold']:g}"
    if held["dryRun"]:
        lines = [
            _field("Quarantine", f"dry run since {_time(held['since'])}, {at}"),
            _more("not cordoned, no job moved (RESURGE_NODE_QUARANTINE=dry-run)"),
        ]
    else:
        lines = [_field("Quarantine", f"since {_time(held['since'])}, {at}")]
    lines.append(_more(f"why: {held['why'] or 'the faults below'}"))
    if not held["dryRun"]:
        lines.append(_more(f"jobs moved off: {', '.join(held['jobs']) or 'none'}"))
    lines.append(_more(f"ends with `resurge node uncordon {view['name']}` once it is repaired"))
    return lines


def _history_lines(view: Mapping[str, Any]) -> list[str]:
    incidents = view["incidents"]
    counted = view["counted"]
    if not incidents:
        return ["Faults counted: none"]
    kept = "" if counted <= len(incidents) else f"; the last {len(incidents)} kept"
    lines = [f"Faults counted: {counted} in all{kept}, newest first"]
    for incident in incidents:
        job = f"  job {incident['job']}" if incident["job"] else ""
        lines.append(
            f"  {_time(incident['time'])}  +{incident['weight']:g}  "
            f"{incident['rule']} ({incident['reason']}){job}"
        )
        message = _first_line(incident["message"])
        if message:
            lines.append(f"      {message}")
    return lines


def _field(label: str, value: str) -> str:
    return f"{label + ':':<14}{value}"


def _more(value: str) -> str:
    return " " * 14 + value


def _labels(labels: Mapping[str, str], between: str) -> str:
    return between.join(f"{k}={v}" for k, v in sorted(labels.items()))


def _number(value: float) -> str:
    """A score: ``0``, else two decimals: ``2.87``, ``1.00``."""
    return "0" if value == 0 else f"{value:.2f}"


def _time(iso: str) -> str:
    when = datetime.fromisoformat(iso)
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _first_line(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."
