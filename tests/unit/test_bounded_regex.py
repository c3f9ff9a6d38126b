"""The log rules' bounded matching: which characters a pattern requires of a line, and a
line without them answered at once, even when the line's budget is spent."""

from __future__ import annotations

import pytest
import regex

from resurge_detector.bounded_regex import LineBudget, MatchTimeout, PatternCache, required_literal


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        ("CUDA error", "CUDA error"),
        ("Loss: ([0-9.]+)", "Loss: "),
        ("NCCL WARN.*timeout", "NCCL WARN"),
        ("errors?", "error"),  # the last character may be missing
        ("ab*c", "a"),
        ("ab{2}", "a"),
        ("a+b", "a"),
        ("^start", ""),
        ("(?i)cuda error", ""),  # any case: no character is required as written
        ("cuda(?i) error", ""),
        ("(?x) a b", ""),  # verbose: spaces are not characters of the line
        ("oom|CUDA", ""),  # either alternative will do
        ("\\d+ steps", ""),
        ("", ""),
    ],
)
def test_the_required_literal_is_the_plain_start_of_the_pattern(pattern: str, literal: str) -> None:
    assert required_literal(regex.compile(pattern)) == literal


def test_a_line_without_the_literal_is_answered_without_a_search() -> None:
    cache = PatternCache()
    slow = cache.get("slow", "(a+)+$")
    literal = cache.get("cuda", "CUDA error")
    assert slow is not None and literal is not None
    budget = LineBudget(seconds=0.0)  # nothing left for a search
    line = "a" * 2000 + "!"
    with pytest.raises(MatchTimeout):
        budget.search(slow, line)
    assert budget.search(literal, line) is None  # no search needed: it cannot match
    with pytest.raises(MatchTimeout):
        budget.search(literal, line + " CUDA error")  # it could: a search, out of budget


def test_a_line_with_the_literal_is_searched() -> None:
    compiled = PatternCache().get("metric", "Loss: ([0-9.]+)")
    assert compiled is not None
    match = LineBudget().search(compiled, "step 3 Loss: 0.25")
    assert match is not None and match.group(1) == "0.25"
    assert LineBudget().search(compiled, "step 3 loss: 0.25") is None
