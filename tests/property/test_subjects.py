"""Subject tokens: any non-empty name escapes to one safe NATS token and back."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resurge.contract.subjects import Subjects, escape_token, unescape_token

SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")
ODD = st.sampled_from(
    ["a.b", "*", ">", "a b", "..", "_", "__x_", "ü", "🚀", "a\tb", "a\nb", "$SYS", "-"]
)
NAMES = st.one_of(ODD, st.text(min_size=1, max_size=40))


@given(NAMES)
def test_escape_gives_one_safe_token_that_unescapes_to_the_name(name: str) -> None:
    token = escape_token(name)
    assert SAFE_TOKEN.fullmatch(token)
    assert unescape_token(token) == name


@given(NAMES, NAMES)
def test_different_names_give_different_tokens(first: str, second: str) -> None:
    assert (escape_token(first) == escape_token(second)) == (first == second)


def test_an_empty_name_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        escape_token("")


@given(NAMES, st.integers(0, 1000), NAMES)
def test_built_subjects_keep_odd_names_in_their_own_token(
    job: str, replica: int, node: str
) -> None:
    subjects = Subjects("ns")
    # "_" as a raw subject's job token means a node's own events; no job can be named
    # "_" (a job name is a DNS-1123 name).
    raw_job = [] if job == "_" else [(subjects.raw(job, "log_line", node), 3, job)]
    for subject, position, name in [
        *raw_job,
        (subjects.cmd(job, replica), 3, job),
        (subjects.raw(job, "log_line", node), 5, node),
        (subjects.capacity(node), 3, node),
    ]:
        tokens = subject.split(".")
        assert all(SAFE_TOKEN.fullmatch(t) for t in tokens), subject
        assert unescape_token(tokens[position]) == name


@given(st.text(max_size=20))
def test_unescaping_any_text_is_a_name_or_a_value_error(token: str) -> None:
    with contextlib.suppress(ValueError):
        unescape_token(token)
