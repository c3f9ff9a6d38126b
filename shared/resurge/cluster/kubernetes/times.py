"""Kubernetes timestamps: pure functions, no I/O.

A ``metav1.Time`` is RFC 3339 in UTC to the second; a ``metav1.MicroTime`` (a Lease's
acquire and renew times) to the microsecond. Reading takes either, and reads a missing
or malformed one as None, never an error of the watch or request that read it.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["micro_time", "now_time", "parse_time"]


def now_time() -> str:
    """The ``metav1.Time`` of now."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(when: datetime) -> str:
    """``when`` as a ``metav1.MicroTime``: RFC 3339 with microseconds, in UTC."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: object) -> datetime | None:
    """The time ``text`` says (UTC where it names no zone); None if it is not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)
