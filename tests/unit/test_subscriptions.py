"""The declarations of every subscription and the families table: consistent with the
event models, and what the permissions derived from them allow."""

from __future__ import annotations

import pytest

from resurge.access.permissions import covers, role_permissions
from resurge.contract.families import (
    FAMILIES,
    FAULT_GRADE_KINDS,
    RAW_JOB_KINDS,
    RAW_NODE_KINDS,
    STREAMS,
    family,
    stream_of,
    streams_of,
)
from resurge.contract.subjects import Subjects
from resurge.contract.subscriptions import (
    DETECTOR_FAULTS,
    DETECTOR_RAW,
    MONITOR_COMMANDS,
    RESTARTER_EXITS,
    RESTARTER_PROGRESS,
    SUBSCRIPTIONS,
    Reader,
    Scope,
    Subscription,
    of_role,
)
from resurge.events import EVENT_KINDS

S = Subjects("ns")


def test_the_families_carry_every_event_kind_once() -> None:
    carried = [k for f in FAMILIES for k in f.kinds]
    assert sorted(carried) == sorted(EVENT_KINDS)
    assert set(RAW_JOB_KINDS + RAW_NODE_KINDS) >= FAULT_GRADE_KINDS
    assert [f.name for f in FAMILIES if f.short_retention] == ["raw"]
    with pytest.raises(ValueError, match="families: raw, fault"):
        family("telemetry")


def test_a_declaration_names_only_kinds_its_family_carries() -> None:
    with pytest.raises(ValueError, match=r"kinds \['assign'\] not on raw"):
        Subscription(
            "restarter", "x", "raw", lambda s, _: s.all("raw"), Reader.DURABLE, ("assign",),
            reads="", durable="x",
        )  # fmt: skip
    with pytest.raises(ValueError, match="a watch reader has no"):
        Subscription(
            "scaler", "x", "job", lambda s, _: s.all("job"), Reader.WATCH, ("job_deleted",),
            reads="", durable="x",
        )  # fmt: skip


def test_bindings_fill_the_open_tokens() -> None:
    monitor = Scope(node="gpu.node-1")
    assert MONITOR_COMMANDS.subject(S, monitor) == S.node_cmd("gpu.node-1")
    assert MONITOR_COMMANDS.consumer(monitor) == "monitor-gpu_2enode-1"
    assert DETECTOR_FAULTS.consumer(Scope(group="detector-1-of-2")) == "detector-1-of-2-faults"


def test_the_fault_grade_raw_kinds_have_a_stream_of_their_own() -> None:
    raw = [one for one in STREAMS if one.family == "raw"]
    assert [one.name for one in raw] == ["raw", "raw-faults"]  # telemetry first: see the bus
    assert set(raw[1].kinds) == FAULT_GRADE_KINDS
    assert sorted(raw[0].kinds + raw[1].kinds) == sorted(family("raw").kinds)  # no overlap
    assert [one.name for one in STREAMS if one.family != "raw"] == [
        f.name for f in FAMILIES if f.name != "raw"
    ]
    assert (DETECTOR_FAULTS.stream, DETECTOR_RAW.stream) == ("raw-faults", "raw")
    assert (RESTARTER_EXITS.stream, RESTARTER_PROGRESS.stream) == ("raw-faults", "raw")
    assert stream_of("fault").name == "fault"
    with pytest.raises(ValueError, match="not in one stream"):
        stream_of("raw", ("progress", "process_exited"))
    assert [one.name for one in streams_of(S.raw("j", None, None))] == ["raw", "raw-faults"]
    assert [one.name for one in streams_of(S.raw(None, "gpu_error", None))] == ["raw-faults"]
    assert [one.name for one in streams_of(S.raw(None, "log_line", None))] == ["raw"]


def test_the_detector_subscribes_to_no_raw_subject() -> None:
    """No live copies: it reads every raw event from a stream, once."""
    assert not [s for s in role_permissions("detector", S).subscribe if ".raw." in s]


@pytest.mark.parametrize(
    ("wide", "narrow", "expected"),
    [
        ("a.raw.>", "a.raw.*.x.*", True),
        ("a.raw.>", "a.raw", False),
        ("a.raw.*.x.*", "a.raw.*.x.*", True),
        ("a.raw.*.x.*", "a.raw.*.y.*", False),
        ("a.raw.*.*.*", "a.raw.j.x.n", True),
        ("a.raw.j.x.n", "a.raw.*.x.n", False),
        ("a.raw.*", "a.raw.>", False),
    ],
)
def test_covers_is_nats_wildcard_matching(wide: str, narrow: str, expected: bool) -> None:
    assert covers(wide, narrow) is expected


def _allowed(subject: str, allow: tuple[str, ...]) -> bool:
    return any(covers(pattern, subject) for pattern in allow)


@pytest.mark.parametrize("entry", SUBSCRIPTIONS, ids=lambda e: f"{e.service}-{e.name}")
def test_each_declared_binding_is_allowed_to_its_role(entry: Subscription) -> None:
    node = "node-1" if entry.role == "agent" else None
    scope = Scope(job="j.1", replica=0, node="node-1", group="detector")
    allowed = role_permissions(entry.role, S, node)
    for one in entry.scopes(scope):
        subject = entry.subject(S, one)
        if entry.reader in (Reader.DURABLE, Reader.BATCHES):
            stream = S.stream(entry.stream)
            create = f"$JS.API.CONSUMER.CREATE.{stream}.{entry.consumer(one)}.{subject}"
            assert _allowed(create, allowed.publish)
            assert _allowed(f"$JS.ACK.{stream}.x.1.2.3", allowed.publish)
        else:
            assert _allowed(subject, allowed.subscribe)


def test_a_role_may_bind_nothing_it_does_not_declare() -> None:
    """The scaler declares no fault reader and the restarter no job reader."""
    scaler, restarter = role_permissions("scaler", S), role_permissions("restarter", S)
    fault = f"$JS.API.CONSUMER.CREATE.{S.stream('fault')}.x.{S.all('fault')}"
    job = f"$JS.API.CONSUMER.CREATE.{S.stream('job')}.x.{S.all('job')}"
    assert not _allowed(fault, scaler.publish) and _allowed(fault, restarter.publish)
    assert not _allowed(job, restarter.publish) and _allowed(job, scaler.publish)
    assert {e.family for e in of_role("viewer")} == set()
