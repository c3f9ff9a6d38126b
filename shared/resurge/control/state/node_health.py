"""Node health records: each node's faults across jobs, its score, its quarantine.

One JetStream KV entry per node (bucket :data:`resurge.runtime.bus.NODE_HEALTH_BUCKET`),
written by the restarter (:mod:`resurge_restarter.node_ledger`) as faults come and as
it drains the node, and by an operator: ``resurge node uncordon`` releases a quarantine,
``resurge node drain`` asks for a drain. Every write is a
compare-and-set on the entry's revision, re-read and re-applied on a conflict. The score
is stored as of ``score_at`` and decays from there (:mod:`resurge.control.decisions.node_score`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import nats.js.errors
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field

from resurge.contract.subjects import escape_token, unescape_token
from resurge.runtime.kv_keys import bucket_keys

__all__ = [
    "Drain",
    "NodeHealth",
    "NodeHealthStore",
    "NodeIncident",
    "Quarantine",
    "Release",
    "ask_drain",
]

_CAS_ATTEMPTS = 20
INCIDENTS_KEPT = 50


class NodeIncident(BaseModel):
    """One fault counted against the node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    time: datetime
    fault_id: str
    reason: str
    rule: str = Field(description="The attribution rule that counted it.")
    weight: float = Field(ge=0)
    job: str | None = None
    gpu: int | None = Field(default=None, description="The GPU, for a GPU's fault.")
    message: str = ""


class Quarantine(BaseModel):
    """Why and since when a node gets no new work (or, dry run, would get none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: datetime
    score: float = Field(description="The score that crossed the threshold.")
    threshold: float
    why: str
    dry_run: bool = Field(default=False, description="Only reported: no cordon, no moves.")
    jobs: list[str] = Field(
        default_factory=list, description="The jobs it was on, told to move off."
    )


class Release(BaseModel):
    """How a quarantine ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    time: datetime
    by: str = Field(description="`operator` (uncordon) or `health_check`.")
    why: str = ""


class Drain(BaseModel):
    """An operator's drain of the node (``resurge node drain``): the restarter cordons it
    and moves each job on it off at its next checkpoint, saying what it did per job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requested: datetime
    by: str = Field(default="operator", description="Who asked for it.")
    reason: str = ""
    jobs: dict[str, str] = Field(
        default_factory=dict,
        description="The jobs on the node when the drain began -> what was done (empty "
        "while it is being done).",
    )
    started: datetime | None = Field(default=None, description="When the restarter took it up.")
    done: datetime | None = Field(default=None, description="When every job was off the node.")


class NodeHealth(BaseModel):
    """One node's record across every job that ran on it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    score: float = Field(default=0.0, ge=0, description="The score as of score_at.")
    score_at: datetime | None = None
    incidents: list[NodeIncident] = Field(
        default_factory=list, description=f"Newest last; the last {INCIDENTS_KEPT}."
    )
    counted: int = Field(default=0, ge=0, description="Incidents counted in all.")
    quarantine: Quarantine | None = None
    last_release: Release | None = None
    drain: Drain | None = Field(default=None, description="The newest drain, done or not.")


def ask_drain(record: NodeHealth, now: datetime, by: str, reason: str) -> bool:
    """Ask for a drain of the node, unless one is still being done. True if asked."""
    if record.drain is not None and record.drain.done is None:
        return False
    record.drain = Drain(requested=now, by=by, reason=reason)
    return True


class NodeHealthStore:
    """Node health records in their KV bucket, every write a compare-and-set."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def get(self, name: str) -> tuple[NodeHealth, int] | None:
        """Node ``name``'s record and its revision, or None when it has none."""
        try:
            entry = await self.kv.get(escape_token(name))
        except nats.js.errors.KeyNotFoundError:
            return None
        if not entry.value or entry.revision is None:
            return None
        return NodeHealth.model_validate_json(entry.value), entry.revision

    async def all(self) -> list[NodeHealth]:
        """Every node's record."""
        found = []
        for key in await bucket_keys(self.kv):
            got = await self.get(unescape_token(key))
            if got is not None:
                found.append(got[0])
        return found

    async def mutate(
        self, name: str, change: Callable[[NodeHealth], bool]
    ) -> tuple[NodeHealth, NodeHealth]:
        """Apply ``change`` (it edits a copy, says whether it changed anything) to node
        ``name``'s record, made if it has none; ``(before, after)``."""
        for _ in range(_CAS_ATTEMPTS):
            found = await self.get(name)
            before = NodeHealth(name=name) if found is None else found[0]
            after = before.model_copy(deep=True)
            if not change(after):
                return before, before
            value = after.model_dump_json().encode()
            try:
                if found is None:
                    await self.kv.create(escape_token(name), value)
                else:
                    await self.kv.update(escape_token(name), value, last=found[1])
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            return before, after
        raise RuntimeError(f"node health record {name!r} kept changing")
