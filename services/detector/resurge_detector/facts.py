"""Packing the detectors' durable facts: JSON, compressed, bounded.

The hang and log-rule detectors keep their ranks' facts (see their module docstrings)
in one entry per replica of a job (:class:`Entries`), so a change rewrites a few ranks,
not a 10 000-rank job's half megabyte. A KV value must fit in one NATS message (1 MiB by
default); entries are stored zlib-compressed. One that still exceeds :data:`MAX_BYTES` is
not stored (its old entry is deleted, and that is logged once per job and hour): that
job's waits are not armed again after a restart, as before there was durable state,
but a failed write can never hold back the raw events the service acks after saving.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable
from typing import Any

from resurge.runtime.logs import RateLimitedLog

__all__ = ["MAX_BYTES", "Entries", "RanksByEntry", "pack", "replica_key", "unpack"]

MAX_BYTES = 512 * 1024

log = logging.getLogger("resurge.detector")
_too_big = RateLimitedLog(log, interval=3600.0)


def pack(job: str, facts: Any) -> bytes | None:
    """``facts`` as stored; None (the entry is deleted) when they exceed :data:`MAX_BYTES`."""
    packed = zlib.compress(json.dumps(facts, separators=(",", ":")).encode(), 6)
    if len(packed) <= MAX_BYTES:
        return packed
    _too_big.warning(
        job,
        f"job {job}: its detector facts take {len(packed)} bytes, over {MAX_BYTES}: not kept, "
        "so a restarted detector will not arm its waits again",
        job=job,
        reason="facts_too_big",
    )
    return None


def unpack(value: bytes) -> Any:
    """What :func:`pack` stored."""
    return json.loads(zlib.decompress(value))


def replica_key(replica: int | None) -> str:
    """The entry that holds one replica's ranks: ``r<replica>`` (``r_``: none named)."""
    return f"r{'_' if replica is None else replica}"


class RanksByEntry:
    """Which ranks each entry of one job's generation holds (:func:`replica_key` of the
    rank's replica), so an entry's facts are gathered from its own ranks. A new
    generation changes every entry as its ranks report; gathering each from a scan of
    all the ranks made that quadratic in the ranks (at 4,096, 0.3 s a batch)."""

    def __init__(self) -> None:
        self._ranks: dict[str, dict[int, None]] = {}  # in filing order
        self._key: dict[int, str] = {}

    def file(self, rank: int, replica: int | None) -> None:
        """``rank`` belongs to ``replica`` (again, or now to another)."""
        key = replica_key(replica)
        known = self._key.get(rank)
        if known == key:
            return
        if known is not None:
            self.remove(rank)
        self._key[rank] = key
        self._ranks.setdefault(key, {})[rank] = None

    def remove(self, rank: int) -> None:
        """``rank`` is in no entry now; a rank not filed is fine."""
        key = self._key.pop(rank, None)
        if key is not None:
            ranks = self._ranks[key]
            del ranks[rank]
            if not ranks:
                del self._ranks[key]

    def ranks(self, key: str) -> list[int]:
        """The ranks entry ``key`` holds, in the order they were filed."""
        return list(self._ranks.get(key, ()))


class Entries:
    """Which entries of each job are stored, and which changed since the last save.

    A job's facts are split into entries (one per replica, so a change rewrites a few
    ranks, not the whole job); :meth:`changes` asks for the value of each changed entry
    and deletes a stored one whose value is gone (None)."""

    def __init__(self) -> None:
        self._stored: dict[str, set[str]] = {}
        self._changed: set[tuple[str, str]] = set()

    def touch(self, job: str, key: str) -> None:
        """``job``'s entry ``key`` changed."""
        self._changed.add((job, key))

    def touch_all(self, job: str) -> None:
        """Every stored entry of ``job`` changed (a new generation; the job's end)."""
        for key in self._stored.get(job, ()):
            self._changed.add((job, key))

    def stored(self, job: str, key: str) -> None:
        """``job``'s entry ``key`` is in the bucket (given back at start)."""
        self._stored.setdefault(job, set()).add(key)

    def changes(
        self, value: Callable[[str, str], bytes | None]
    ) -> dict[tuple[str, str], bytes | None]:
        """Each changed entry's ``value(job, key)``; None deletes a stored entry."""
        out: dict[tuple[str, str], bytes | None] = {}
        for job, key in self._changed:
            now = value(job, key)
            keys = self._stored.setdefault(job, set())
            if now is not None:
                keys.add(key)
            elif key in keys:
                keys.discard(key)
            else:
                continue
            out[(job, key)] = now
            if not keys:
                del self._stored[job]
        self._changed.clear()
        return out
