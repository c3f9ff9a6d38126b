"""The allocation ledger: one writer of placements at a time, by compare-and-set.

Whoever places workers on nodes (the scaler admitting or growing a job, the restarter
moving a replica off a faulty node) reads the ledger's revision, reads the cluster
(:func:`resurge.control.views.cluster_snapshot.read_snapshot`, which counts the ledger's
claims as slots in use), decides, and then writes its placements into the ledger as
:class:`Claim` s with one compare-and-set on that revision (:meth:`Allocations.claim`).
A writer that lost (another placed since it read) gets :class:`AllocationConflict`
and reads and decides again; so two scalers or two restarters never both take one
slot. Once the placement is in its job record (which the snapshot counts), the
claims are dropped (:meth:`Allocations.release`). A claim lapses at ``until``, so a
writer that died holding one does not hold its slots for ever.

Only placing takes the ledger: shrinking, suspending, finishing and a restart that
keeps every replica where it is (in-process, process, pod) free slots or change
nothing, and do not touch it.

The ledger is one key, :data:`LEDGER_KEY`, of the ``allocations`` bucket
(:data:`resurge.runtime.bus.ALLOCATIONS_BUCKET`). :class:`Allocations` needs of its
bucket only ``get``, ``create`` and ``update(..., last=revision)`` with nats.py's
errors, so a test may hand it an in-memory bucket that keeps revisions the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import nats.js.errors
from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from resurge.runtime.bus import Bus

__all__ = [
    "LEDGER_KEY",
    "AllocationConflict",
    "Allocations",
    "Claim",
    "Ledger",
    "LedgerBucket",
    "open_allocations",
]

LEDGER_KEY = "ledger"
"""The one key of the allocations bucket."""

_RELEASE_ATTEMPTS = 50


class Claim(BaseModel):
    """Slots of one node taken for a placement decided and not yet in its job record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str = Field(description="The job the slots are for.")
    replica: int | None = Field(description="The replica placed there; None: a held spare.")
    node: str = Field(description="The node.")
    slots: int = Field(ge=1, description="Slots taken (the job's nprocPerNode).")
    holder: str = Field(description="The service instance that placed it.")
    until: datetime = Field(description="When the claim lapses if not dropped before.")


class Ledger(BaseModel):
    """The ledger's value: every claim written and not yet dropped."""

    model_config = ConfigDict(extra="ignore")

    claims: list[Claim] = Field(default_factory=list, description="The claims.")


class AllocationConflict(Exception):
    """Another writer placed workers since the ledger revision a decision read."""


class LedgerBucket(Protocol):
    """What :class:`Allocations` uses of a KV bucket (nats.py's ``KeyValue``)."""

    async def get(self, key: str) -> Any: ...  # noqa: D102 - nats.py's signature

    async def create(self, key: str, value: bytes) -> int: ...  # noqa: D102

    async def update(self, key: str, value: bytes, last: int | None = None) -> int: ...  # noqa: D102


class Allocations:
    """The ledger in ``kv``, written as ``holder``; ``clock`` says when claims lapse."""

    def __init__(
        self,
        kv: LedgerBucket,
        holder: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kv = kv
        self.holder = holder
        self.clock = clock

    def make(self, job: str, replica: int | None, node: str, slots: int, ttl: float) -> Claim:
        """A claim of ``slots`` on ``node`` for ``job``'s ``replica`` (None: a spare),
        held by this writer, lapsing ``ttl`` seconds from now."""
        until = self.clock() + timedelta(seconds=ttl)
        return Claim(
            job=job, replica=replica, node=node, slots=slots, holder=self.holder, until=until
        )

    async def _entry(self) -> tuple[list[Claim], int]:
        try:
            entry = await self.kv.get(LEDGER_KEY)
        except nats.js.errors.KeyNotFoundError:
            return [], 0
        if not entry.value:
            return [], int(entry.revision)
        return Ledger.model_validate_json(entry.value).claims, int(entry.revision)

    async def read(self) -> tuple[list[Claim], int]:
        """The live claims and the ledger's revision (0: no ledger written yet)."""
        claims, revision = await self._entry()
        now = self.clock()
        return [c for c in claims if c.until > now], revision

    async def _write(self, claims: list[Claim], revision: int) -> int:
        value = Ledger(claims=claims).model_dump_json().encode()
        try:
            if revision == 0:
                return int(await self.kv.create(LEDGER_KEY, value))
            return int(await self.kv.update(LEDGER_KEY, value, last=revision))
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise AllocationConflict(f"the allocation ledger moved past {revision}") from error

    async def claim(self, held: Iterable[Claim], revision: int, new: Iterable[Claim]) -> int:
        """Write ``new`` beside ``held`` (the live claims :meth:`read` gave at
        ``revision``) if the ledger is still at ``revision``; the new revision.
        :class:`AllocationConflict` if another writer wrote meanwhile."""
        return await self._write([*held, *new], revision)

    async def release(self, claims: Iterable[Claim]) -> None:
        """Drop ``claims`` (and every lapsed claim), retrying on concurrent writes: a
        drop frees slots, so it never needs a new decision."""
        gone = set(claims)
        if not gone:
            return
        for _ in range(_RELEASE_ATTEMPTS):
            stored, revision = await self._entry()
            now = self.clock()
            kept = [c for c in stored if c not in gone and c.until > now]
            if len(kept) == len(stored):
                return
            try:
                await self._write(kept, revision)
                return
            except AllocationConflict:
                continue
        raise AllocationConflict(f"could not drop {len(gone)} claim(s): the ledger kept moving")


async def open_allocations(bus: Bus, holder: str, create: bool = True) -> Allocations | None:
    """The ledger on ``bus``, written as ``holder`` (its bucket made if missing and
    ``create``, as placers do); None where it is missing and not ``create`` (a viewer:
    no ledger yet, no claims)."""
    kv = await bus.allocations_bucket(create=create)
    return None if kv is None else Allocations(kv, holder)
