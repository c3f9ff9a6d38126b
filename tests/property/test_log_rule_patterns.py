"""Log-rule patterns come from users: a catastrophic one is bounded in time per line.

The spec accepts any pattern Python's ``re`` compiles (``(a+)+$`` does), so the
detector's matching (``resurge_detector.bounded_regex``) is what must hold: each search
is cut off by a timeout, a line's searches share a budget, and nothing but
``MatchTimeout`` escapes.
"""

from __future__ import annotations

import contextlib
import time

from hypothesis import given
from hypothesis import strategies as st

from resurge_detector.bounded_regex import (
    LINE_BUDGET_SECONDS,
    MAX_LINE_CHARS,
    LineBudget,
    MatchTimeout,
    PatternCache,
)

# Nested and overlapping repeats: exponential backtracking on a near-miss.
CATASTROPHIC = [
    "(a+)+$",
    "(a|aa)+$",
    "(a*)*b",
    "(a|a?)+$",
    "^(([a-z])+.)+[A-Z]([a-z])+$",
    "(.*a){20}",
]
# Far above the budget, but generous for a loaded two-core machine.
WALL_LIMIT_SECONDS = 1.0


def timed_search(pattern: str, line: str) -> tuple[bool, float]:
    """Whether the search timed out, and how long it took."""
    compiled = PatternCache().get("rule", pattern)
    assert compiled is not None
    started = time.perf_counter()
    try:
        LineBudget().search(compiled, line[:MAX_LINE_CHARS])
    except MatchTimeout:
        return True, time.perf_counter() - started
    return False, time.perf_counter() - started


def test_a_catastrophic_pattern_runs_out_of_time_instead_of_hanging() -> None:
    timed_out, took = timed_search("(a+)+$", "a" * 4000 + "!")
    assert timed_out
    assert took < WALL_LIMIT_SECONDS


@given(
    st.sampled_from(CATASTROPHIC),
    st.integers(20, MAX_LINE_CHARS * 2),
    st.sampled_from(["!", "b", "A", ""]),
)
def test_catastrophic_patterns_are_bounded_on_long_lines(
    pattern: str, length: int, tail: str
) -> None:
    _, took = timed_search(pattern, "a" * length + tail)
    assert took < WALL_LIMIT_SECONDS


@given(st.lists(st.sampled_from(CATASTROPHIC), min_size=2, max_size=20))
def test_the_rules_of_one_line_share_one_budget(patterns: list[str]) -> None:
    cache = PatternCache()
    budget = LineBudget()
    line = "a" * 3000 + "!"
    started = time.perf_counter()
    for index, pattern in enumerate(patterns):
        compiled = cache.get(f"rule-{index}", pattern)
        assert compiled is not None
        try:
            budget.search(compiled, line)
        except MatchTimeout:
            continue
    assert time.perf_counter() - started < LINE_BUDGET_SECONDS + WALL_LIMIT_SECONDS


@given(st.text(max_size=40), st.text(max_size=200))
def test_any_pattern_compiles_or_is_skipped_and_any_search_ends(pattern: str, line: str) -> None:
    compiled = PatternCache().get("rule", pattern)
    if compiled is None:
        return
    with contextlib.suppress(MatchTimeout):
        LineBudget().search(compiled, line)


def test_patterns_that_break_the_compiler_are_skipped() -> None:
    cache = PatternCache()
    for pattern in ["a{4294967296}", "(" * 5000 + ")" * 5000, "["]:
        assert cache.get("rule", pattern) is None


# Patterns and lines over a small alphabet, so the required literal is often present,
# often absent, and often cut short by a special character.
_PATTERN_CHARS = st.sampled_from(list("abAB ") + list("\\.^$*+?{}[]()|#") + ["(?i)", "(?x)", "\\d"])
_LINE = st.text(alphabet="abAB #0.", max_size=30)


@given(st.lists(_PATTERN_CHARS, max_size=12).map("".join), _LINE)
def test_a_line_is_answered_as_the_pattern_itself_answers_it(pattern: str, line: str) -> None:
    compiled = PatternCache().get("rule", pattern)
    if compiled is None:
        return
    try:
        found = LineBudget().search(compiled, line)
    except MatchTimeout:
        return
    plain = compiled.pattern.search(line)
    assert (found is None) == (plain is None), (pattern, line, compiled.literal)
    if found is not None and plain is not None:
        assert found.span() == plain.span()


@given(st.lists(_PATTERN_CHARS, max_size=12).map("".join), _LINE)
def test_every_match_contains_the_required_literal(pattern: str, line: str) -> None:
    compiled = PatternCache().get("rule", pattern)
    if compiled is None:
        return
    match = compiled.pattern.search(line)
    if match is not None:
        assert compiled.literal in line[match.start() :], (pattern, line, compiled.literal)
