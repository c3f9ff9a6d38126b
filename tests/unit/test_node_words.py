"""``resurge node list`` and ``node describe`` in words and JSON, from health records
made by the score's own functions (pure: no bus)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from resurge.cli.node_words import describe_lines, list_line, score_words
from resurge.control.decisions.node_attribution import attribute
from resurge.control.decisions.node_score import NodePolicy, apply_incident, release
from resurge.control.state.node_health import INCIDENTS_KEPT, NodeHealth
from resurge.control.views.node_record import record_view, score_view
from resurge.events import FaultDetected, FaultScope, Source

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
DETECTOR = Source(service="detector", instance="d")
NODE = {
    "name": "n1",
    "slots": 8,
    "free": 2,
    "healthy": True,
    "reporting": True,
    "cordoned": False,
    "cordonReason": None,
    "jobs": ["a", "b"],
    "labels": {"zone": "a", "pool": "spot"},
}


def xid48(at: timedelta, job: str, message: str = "") -> FaultDetected:
    return FaultDetected(
        source=DETECTOR,
        time=T0 + at,
        fault_id=f"gpu:n1:0:48:{job}:{at}",
        scope=FaultScope.NODE,
        reason="gpu_xid",
        message=message or f"XID 48 on GPU 0 of n1 under job {job}",
        evidence={"xid": 48, "action": "reset_gpu"},
        job=job,
        node="n1",
    )


def faulted(*faults: FaultDetected, policy: NodePolicy | None = None) -> NodeHealth:
    record = NodeHealth(name="n1")
    for fault in faults:
        counted = attribute(fault)
        assert counted is not None
        assert apply_incident(record, fault, counted, fault.time, policy or NodePolicy())
    return record


def described(record: NodeHealth | None, now: datetime, **node: Any) -> dict[str, Any]:
    return {**NODE, **node, **record_view(record, now, NodePolicy())}


def test_a_node_with_no_record_scores_0_and_says_no_fault_was_counted() -> None:
    view = described(None, T0)
    assert (view["score"], view["quarantine"], view["incidents"]) == (0.0, None, [])
    assert score_words(view) == "score: 0"
    lines = describe_lines(view)
    assert lines[0] == "Node:         n1"
    assert "Slots:        2/8 free" in lines and "Jobs:         a, b" in lines
    assert "Labels:       pool=spot, zone=a" in lines
    assert lines[lines.index("Quarantine:   none") - 1] == (
        "Score:        0, no faults counted (quarantine at 2.5, "
        "RESURGE_NODE_QUARANTINE=enforce; halves every 24 hours)"
    )
    assert lines[-2:] == ["Last release: none", "Faults counted: none"]


def test_the_score_is_decayed_to_now_and_the_history_is_newest_first() -> None:
    record = faulted(xid48(timedelta(0), "a"), xid48(HOUR, "b", "first line\nsecond"))
    view = described(record, T0 + HOUR + 24 * HOUR)  # a half-life after the second
    assert view["score"] == round((0.5 ** (1 / 24) + 1) / 2, 3)
    assert [i["job"] for i in view["incidents"]] == ["b", "a"]
    assert view["counted"] == 2 and view["quarantine"] is None
    assert score_words(view) == f"score: {view['score']:.2f}"
    lines = describe_lines(view)
    history = lines[lines.index("Faults counted: 2 in all, newest first") + 1 :]
    assert history == [
        "  2026-12-06 13:00:00 UTC  +1  xid_takes_gpu_out (gpu_xid)  job b",
        "      first line",  # a message's first line only
        "  2026-12-06 12:00:00 UTC  +1  xid_takes_gpu_out (gpu_xid)  job a",
        "      XID 48 on GPU 0 of n1 under job a",
    ]


def test_a_quarantined_node_says_since_when_why_and_the_jobs_moved_off() -> None:
    record = faulted(*(xid48(i * HOUR, job) for i, job in enumerate("aba")))
    assert record.quarantine is not None
    record.quarantine = record.quarantine.model_copy(update={"jobs": ["a", "b"]})
    held = record.quarantine
    reason = f"quarantined: score {held.score:.2f} >= 2.5: {held.why}"  # as the ledger's
    view = described(record, T0 + 2 * HOUR, cordoned=True, cordonReason=reason)
    assert view["quarantine"]["jobs"] == ["a", "b"] and not view["quarantine"]["dryRun"]
    assert score_words(view) == f"score: {view['score']:.2f} (quarantined)"
    lines = describe_lines(view)
    assert f"State:        cordoned ({reason})" in lines
    start = lines.index(
        f"Quarantine:   since 2026-12-06 14:00:00 UTC, at score {held.score:.2f} >= 2.5"
    )
    assert lines[start + 1 : start + 4] == [
        "              why: 3 x xid_takes_gpu_out (jobs a, b)",
        "              jobs moved off: a, b",
        "              ends with `resurge node uncordon n1` once it is repaired",
    ]
    line = list_line(view)
    assert line.startswith(f"n1               2/8 free  cordoned ({reason})  jobs: a,b  ")
    assert line.endswith(
        f"jobs: a,b  score: {view['score']:.2f} (quarantined)  labels: pool=spot,zone=a"
    )


def test_a_dry_run_says_it_would_quarantine_and_moved_nothing() -> None:
    dry = NodePolicy(mode="dry-run", threshold=1.0)
    view = described(faulted(xid48(timedelta(0), "a"), policy=dry), T0)
    assert view["quarantine"]["dryRun"] and score_words(view) == (
        "score: 1.00 (would quarantine: dry run)"
    )
    lines = describe_lines(view)
    start = lines.index("Quarantine:   dry run since 2026-12-06 12:00:00 UTC, at score 1.00 >= 1")
    assert lines[start + 1] == (
        "              not cordoned, no job moved (RESURGE_NODE_QUARANTINE=dry-run)"
    )
    assert not any("jobs moved off" in line for line in lines)


def test_a_released_node_scores_0_and_shows_who_released_it() -> None:
    record = faulted(*(xid48(i * HOUR, "a") for i in range(3)))
    assert release(record, T0 + 3 * HOUR, "operator", "resurge node uncordon")
    view = described(record, T0 + 4 * HOUR)
    assert (view["score"], view["quarantine"]) == (0.0, None)
    assert view["lastRelease"] == {
        "time": (T0 + 3 * HOUR).isoformat(),
        "by": "operator",
        "why": "resurge node uncordon",
    }
    lines = describe_lines(view)
    assert "Last release: 2026-12-06 15:00:00 UTC by operator (resurge node uncordon)" in lines
    assert "Faults counted: 3 in all, newest first" in lines  # the history stays


def test_more_faults_than_kept_say_how_many_of_them_are_shown() -> None:
    off = NodePolicy(mode="off")
    record = faulted(*(xid48(i * HOUR, "a") for i in range(INCIDENTS_KEPT + 2)), policy=off)
    view = {**NODE, **record_view(record, record.incidents[-1].time, off)}
    assert len(view["incidents"]) == INCIDENTS_KEPT and view["counted"] == INCIDENTS_KEPT + 2
    lines = describe_lines(view)
    assert (
        f"Faults counted: {INCIDENTS_KEPT + 2} in all; the last {INCIDENTS_KEPT} kept, newest first"
    ) in lines
    assert any("RESURGE_NODE_QUARANTINE=off: never quarantined" in line for line in lines)
    assert view["quarantine"] is None  # off: scored, never quarantined


def test_a_node_only_a_record_knows_is_shown_as_not_in_the_cluster() -> None:
    record = faulted(xid48(timedelta(0), "a"))
    view = {"name": "gone", "inCluster": False, **record_view(record, T0, NodePolicy())}
    lines = describe_lines(view)
    assert lines[:2] == ["Node:         gone", "State:        not in the cluster"]
    assert not any(line.startswith(("Slots:", "Jobs:")) for line in lines)


def test_list_keeps_its_fields_and_a_powered_off_node_says_so() -> None:
    view = {**NODE, "labels": {}, "jobs": [], **score_view(None, T0, NodePolicy())}
    assert list_line(view) == "n1               2/8 free  ready  jobs: -  score: 0"
    assert "powered off (`resurge node up n1`)" in list_line(view, powered_off=True)
    silent = {**view, "reporting": False, "cordoned": True, "cordonReason": "gpu fault"}
    assert "  not reporting (gpu fault)  " in list_line(silent)
