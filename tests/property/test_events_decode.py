"""decode_event: every body either decodes to an event or raises DecodeError with a reason.

Nothing else may escape: a subscriber that got a TypeError or RecursionError instead
would neither dead-letter nor ack the message.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resurge.events import (
    EVENT_KINDS,
    SCHEMA_VERSION,
    DeadLetterReason,
    DecodeError,
    Envelope,
    decode_event,
    encode_event,
)
from tests.property.strategies import document_of, events, json_values


def decode_or_error(data: bytes) -> Envelope | DecodeError:
    """The event, or the DecodeError; any other exception fails the test."""
    try:
        return decode_event(data)
    except DecodeError as error:
        assert error.reason in DeadLetterReason
        assert error.detail
        return error


@given(events)
def test_valid_events_round_trip(event: Envelope) -> None:
    back = decode_event(encode_event(event))
    assert type(back) is type(event)
    assert back == event


@given(st.binary(max_size=512))
def test_random_bytes_never_raise_anything_but_decode_error(data: bytes) -> None:
    result = decode_or_error(data)
    assert isinstance(result, DecodeError)


@given(events, st.data())
def test_truncated_json_is_not_json(event: Envelope, data: st.DataObject) -> None:
    body = encode_event(event)
    cut = data.draw(st.integers(0, len(body) - 1))
    result = decode_or_error(body[:cut])
    assert isinstance(result, DecodeError)
    assert result.reason is DeadLetterReason.NOT_JSON


@given(events, st.data())
def test_a_field_of_the_wrong_type_is_invalid_and_named(
    event: Envelope, data: st.DataObject
) -> None:
    document = document_of(event)
    field = data.draw(st.sampled_from(sorted(set(document) - {"kind"})))
    document[field] = data.draw(json_values)
    result = decode_or_error(json.dumps(document).encode())
    if isinstance(result, DecodeError):  # else the value happened to fit
        assert result.reason is DeadLetterReason.INVALID
        assert field in result.detail or "(event)" in result.detail
    else:
        assert result.kind == event.kind


@given(events, st.text(min_size=1, max_size=20), json_values)
def test_an_unknown_field_is_invalid_and_named(event: Envelope, name: str, value: Any) -> None:
    document = document_of(event)
    if name in document:
        name = f"{name}_unknown"
    document[name] = value
    result = decode_or_error(json.dumps(document).encode())
    assert isinstance(result, DecodeError)
    assert result.reason is DeadLetterReason.INVALID
    assert name in result.detail


@given(events, json_values)
def test_an_unknown_or_malformed_kind_is_unknown_kind(event: Envelope, kind: Any) -> None:
    if isinstance(kind, str) and kind in EVENT_KINDS:
        kind = f"{kind}_from_the_future"
    document = document_of(event)
    document["kind"] = kind
    result = decode_or_error(json.dumps(document).encode())
    assert isinstance(result, DecodeError)
    assert result.reason is DeadLetterReason.UNKNOWN_KIND


@given(events, st.integers(-(2**64), 2**64).filter(lambda v: v != SCHEMA_VERSION))
def test_another_schema_version_is_invalid(event: Envelope, version: int) -> None:
    document = document_of(event)
    document["schema_version"] = version
    result = decode_or_error(json.dumps(document).encode())
    assert isinstance(result, DecodeError)
    assert result.reason is DeadLetterReason.INVALID
    assert "schema_version" in result.detail


@given(json_values.filter(lambda v: not isinstance(v, dict)))
def test_json_that_is_not_an_object_is_invalid(value: Any) -> None:
    result = decode_or_error(json.dumps(value).encode())
    assert isinstance(result, DecodeError)
    assert result.reason is DeadLetterReason.INVALID


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # nesting deeper than the JSON parser's recursion
        (b"[" * 100_000 + b"]" * 100_000, DeadLetterReason.NOT_JSON),
        (
            b'{"kind":"log_line","x":' + b"[" * 50_000 + b"]" * 50_000 + b"}",
            DeadLetterReason.NOT_JSON,
        ),
        # an integer of more digits than Python converts
        (b'{"kind":"log_line","pid":' + b"9" * 5000 + b"}", DeadLetterReason.NOT_JSON),
        # kinds that are not even hashable
        (b'{"kind":[]}', DeadLetterReason.UNKNOWN_KIND),
        (b'{"kind":{"a":1}}', DeadLetterReason.UNKNOWN_KIND),
        # a megabyte of one string field, and a megabyte of nothing
        (b'{"kind":"log_line","line":"' + b"x" * 1_000_000 + b'"}', DeadLetterReason.INVALID),
        (b" " * 1_000_000, DeadLetterReason.NOT_JSON),
        (b"\xff\xfe" + b"\x00" * 1000, DeadLetterReason.NOT_JSON),
    ],
    ids=[
        "deep-array",
        "deep-field",
        "huge-int",
        "list-kind",
        "dict-kind",
        "huge-line",
        "blank",
        "utf16",
    ],
)
def test_hostile_bodies_are_decode_errors(body: bytes, reason: DeadLetterReason) -> None:
    result = decode_or_error(body)
    assert isinstance(result, DecodeError)
    assert result.reason is reason
    assert len(result.detail) <= 10_000  # the detail is for people, never the payload
