"""Regular expressions whose work per log line is bounded (for the log-rule detector).

Patterns come from users' job specs, so a pathological one (``(a+)+$`` against a long
line of ``a``) must not stall the detector. Stdlib :mod:`re` cannot be interrupted; the
``regex`` package takes the same syntax (its default VERSION0 mode is compatible with
:mod:`re`, which validates the specs) and a ``timeout=`` per call. Every line is cut to
:data:`MAX_LINE_CHARS` before matching, each search gets at most
:data:`PATTERN_TIMEOUT_SECONDS`, and all the searches for one line share
:data:`LINE_BUDGET_SECONDS`. A search that runs out of time raises :class:`MatchTimeout`;
nothing else escapes.

:class:`PatternCache` compiles each (rule name, pattern) once, as a
:class:`BoundedPattern`; a pattern that does not compile is remembered as ``None`` and
warned about once.

A timed search costs several times an untimed one, whatever the line, so a pattern that
begins with plain characters (``CUDA error``, ``Loss: ([0-9.]+)``) keeps them as its
*required literal*: a line that does not contain it cannot match, and is answered
without a search (and without spending the line's budget). Only characters that match
themselves count (none when the pattern ignores case, is verbose, or has an
alternative), so the answer is the search's own.
"""

from __future__ import annotations

import logging
import time

import regex

__all__ = [
    "LINE_BUDGET_SECONDS",
    "MAX_LINE_CHARS",
    "PATTERN_TIMEOUT_SECONDS",
    "BoundedPattern",
    "LineBudget",
    "Match",
    "MatchTimeout",
    "Pattern",
    "PatternCache",
    "required_literal",
]

log = logging.getLogger("resurge.detector.log_rules")

MAX_LINE_CHARS = 4096
PATTERN_TIMEOUT_SECONDS = 0.02
LINE_BUDGET_SECONDS = 0.05
_CACHE_SIZE = 1024

Pattern = regex.Pattern[str]
Match = regex.Match[str]

# Characters that may not match themselves (or make the one before them optional).
_SPECIAL = frozenset("\\.^$*+?{}[]()|#")
_QUANTIFIERS = frozenset("*?{")
# Flags under which a plain character may match something other than itself.
_LOOSE = regex.IGNORECASE | regex.VERBOSE


def required_literal(pattern: Pattern) -> str:
    """Characters every match of ``pattern`` contains, in a row ("" when unsure)."""
    source = pattern.pattern
    if pattern.flags & _LOOSE or "|" in source:
        return ""
    end = 0
    while end < len(source) and source[end] not in _SPECIAL:
        end += 1
    if end < len(source) and source[end] in _QUANTIFIERS:
        end -= 1  # the last plain character may repeat zero times
    return source[: max(end, 0)]


class BoundedPattern:
    """A compiled pattern and its required literal (see the module docstring)."""

    __slots__ = ("literal", "pattern")

    def __init__(self, pattern: Pattern) -> None:
        self.pattern = pattern
        self.literal = required_literal(pattern)


class MatchTimeout(Exception):
    """A search ran out of time (its own limit or the line's budget)."""


class PatternCache:
    """Compiled patterns by (rule name, pattern); the oldest entry goes when it is full."""

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self.size = size
        self._compiled: dict[tuple[str, str], BoundedPattern | None] = {}

    def get(self, rule: str, pattern: str) -> BoundedPattern | None:
        """``pattern`` compiled for ``rule``; None (logged once) when it does not compile."""
        key = (rule, pattern)
        if key in self._compiled:
            return self._compiled[key]
        compiled: BoundedPattern | None
        try:
            compiled = BoundedPattern(regex.compile(pattern))
        # Whatever the pattern does to the compiler (error, overflow, recursion), the
        # rule is skipped and the detector keeps going.
        except Exception as error:
            log.warning(
                "log rule %r: pattern %r does not compile (%s); rule skipped",
                rule,
                pattern,
                error,
                extra={"reason": "bad_pattern"},
            )
            compiled = None
        if len(self._compiled) >= self.size:
            del self._compiled[next(iter(self._compiled))]
        self._compiled[key] = compiled
        return compiled


class LineBudget:
    """The time left for matching one line against all of its rules (counted from the
    line's first search)."""

    __slots__ = ("deadline", "seconds")

    def __init__(self, seconds: float = LINE_BUDGET_SECONDS) -> None:
        self.seconds = seconds
        self.deadline: float | None = None

    def search(self, bounded: BoundedPattern, text: str) -> Match | None:
        """``pattern.search(text)`` within the budget; :class:`MatchTimeout` when out of time.

        A line without the pattern's required literal is None at once."""
        if bounded.literal not in text:
            return None
        pattern = bounded.pattern
        now = time.perf_counter()
        if self.deadline is None:
            self.deadline = now + self.seconds
        left = min(self.deadline - now, PATTERN_TIMEOUT_SECONDS)
        if left <= 0:
            raise MatchTimeout("line budget spent")
        try:
            return pattern.search(text, timeout=left)
        except TimeoutError:
            raise MatchTimeout(f"pattern {pattern.pattern!r} timed out") from None
        # Anything else the engine raises on a line (memory, recursion) is treated alike.
        except Exception as error:
            raise MatchTimeout(f"pattern {pattern.pattern!r} failed: {error}") from None
