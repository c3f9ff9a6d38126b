"""Regular expressions whose work per log line is bounded (for the log-rule detector).

Patterns come from users' job specs, so a pathological one (``(a+)+$`` against a long
line of ``a``) must not stall the detector. Stdlib :mod:`re` cannot be interrupted; the
``regex`` package takes the same syntax (its default VERSION0 mode is compatible with
:mod:`re`, which validates the specs) and a ``timeout=`` per call. Every line is cut to
:data:`MAX_LINE_CHARS` before matching, each search gets at most
:data:`PATTERN_TIMEOUT_SECONDS`, and all the searches for one line share
:data:`LINE_BUDGET_SECONDS`. A search that runs out of time raises :class:`MatchTimeout`;
nothing else escapes.

:class:`PatternCache` compiles each (rule name, pattern) once; a pattern that does not
compile is remembered as ``None`` and warned about once.
"""

from __future__ import annotations

import logging
import time

import regex

__all__ = [
    "LINE_BUDGET_SECONDS",
    "MAX_LINE_CHARS",
    "PATTERN_TIMEOUT_SECONDS",
    "LineBudget",
    "Match",
    "MatchTimeout",
    "Pattern",
    "PatternCache",
]

log = logging.getLogger("resurge.detector.log_rules")

MAX_LINE_CHARS = 4096
PATTERN_TIMEOUT_SECONDS = 0.02
LINE_BUDGET_SECONDS = 0.05
_CACHE_SIZE = 1024

Pattern = regex.Pattern[str]
Match = regex.Match[str]


class MatchTimeout(Exception):
    """A search ran out of time (its own limit or the line's budget)."""


class PatternCache:
    """Compiled patterns by (rule name, pattern); the oldest entry goes when it is full."""

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self.size = size
        self._compiled: dict[tuple[str, str], Pattern | None] = {}

    def get(self, rule: str, pattern: str) -> Pattern | None:
        """``pattern`` compiled for ``rule``; None (logged once) when it does not compile."""
        key = (rule, pattern)
        if key in self._compiled:
            return self._compiled[key]
        compiled: Pattern | None
        try:
            compiled = regex.compile(pattern)
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
    """The time left for matching one line against all of its rules."""

    def __init__(self, seconds: float = LINE_BUDGET_SECONDS) -> None:
        self.deadline = time.perf_counter() + seconds

    def search(self, pattern: Pattern, text: str) -> Match | None:
        """``pattern.search(text)`` within the budget; :class:`MatchTimeout` when out of time."""
        left = min(self.deadline - time.perf_counter(), PATTERN_TIMEOUT_SECONDS)
        if left <= 0:
            raise MatchTimeout("line budget spent")
        try:
            return pattern.search(text, timeout=left)
        except TimeoutError:
            raise MatchTimeout(f"pattern {pattern.pattern!r} timed out") from None
        # Anything else the engine raises on a line (memory, recursion) is treated alike.
        except Exception as error:
            raise MatchTimeout(f"pattern {pattern.pattern!r} failed: {error}") from None
