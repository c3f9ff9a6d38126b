"""The worker wire protocol: any line parses or is a ProtocolError with a known reason,
and the agent's line splitter finds the same lines however the bytes arrive."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from resurge.worker.wire import (
    MAX_LINE_BYTES,
    REJECT_REASONS,
    ProtocolError,
    parse_agent_message,
    parse_worker_message,
)
from resurge_node_agent.launch.worker_channel import _Lines

HOSTILE_LINES = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"[" * 100_000,
            b'{"type":"hello","local_rank":' + b"9" * 5000 + b"}",
            b'{"type":"progress","step":1,"metrics":{"a":1e999}}',
            b'{"type":"progress","step":true,"metrics":{}}',
            b'{"type":{"nested":[1,2]}}',
            b"\xff\xfe\x00",
            b"null",
        ]
    ),
)


@given(HOSTILE_LINES)
def test_any_line_from_a_worker_parses_or_is_a_protocol_error(line: bytes) -> None:
    try:
        parse_worker_message(line)
    except ProtocolError as error:
        assert error.reason in REJECT_REASONS


@given(HOSTILE_LINES)
def test_any_line_from_an_agent_parses_or_is_a_protocol_error(line: bytes) -> None:
    try:
        parse_agent_message(line)
    except ProtocolError as error:
        assert error.reason in REJECT_REASONS


def split_reference(stream: bytes) -> tuple[list[bytes], int]:
    """Lines of ``stream`` within the bound, and how many were over it."""
    *lines, _ = stream.split(b"\n")
    kept = [line for line in lines if len(line) + 1 <= MAX_LINE_BYTES]
    return kept, len(lines) - len(kept)


LINE_LENGTHS = st.sampled_from([0, 1, 50, MAX_LINE_BYTES - 1, MAX_LINE_BYTES, 3 * MAX_LINE_BYTES])


@given(st.lists(LINE_LENGTHS, max_size=6), st.lists(st.integers(1, 2 * MAX_LINE_BYTES), max_size=8))
def test_lines_are_the_same_however_the_stream_is_cut(lengths: list[int], cuts: list[int]) -> None:
    stream = b"".join(b"x" * length + b"\n" for length in lengths)
    splitter = _Lines()
    lines: list[bytes] = []
    too_long = 0
    position = 0
    for size in [*cuts, len(stream)]:
        chunk = stream[position : position + size]
        position += len(chunk)
        found, over = splitter.feed(chunk)
        lines += found
        too_long += over
        assert len(splitter._buffer) < MAX_LINE_BYTES  # the buffer is bounded
    assert (lines, too_long) == split_reference(stream)
