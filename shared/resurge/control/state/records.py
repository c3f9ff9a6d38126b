"""Job records: each job's lasting state, one JetStream KV entry per job.

Every write is a compare-and-set on the entry's revision, so two writers never both
win: :meth:`JobStore.mutate` re-reads and re-applies its change on a conflict. A
store remembers the newest record it has read, written or been told of
(:meth:`JobStore.remember`, e.g. from a KV watch), and a mutation starts from that
instead of reading again: the compare-and-set refuses it if it is stale, and a change
that finds nothing to do in a remembered record is tried again on a fresh read, so
remembering saves a round trip and never decides on old state. A
record holds what the control plane decided (generation, placement, phase, restart
counts); events say what happened.

A record is stored as its JSON, zlib-compressed once that is over
:data:`COMPRESSED_ABOVE` bytes (a job of thousands of replicas holds each one's
placement, twice while a plan is pending: 16,384 replicas are about 2 MB of JSON,
over NATS's 1 MiB message limit, and about 0.3 MB compressed). JSON starts with ``{``
and zlib with ``x``, so :meth:`JobRecord.from_entry` reads either. Sets of ranks are
stored as ranges (``[[0, 16383]]``), not one number per rank.
"""

from __future__ import annotations

import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Annotated, Self

import nats.js.errors
from nats.js.kv import KeyValue
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator

from resurge.contract.subjects import escape_token, unescape_token
from resurge.events import JobPhase, RecoveryLevel, RestoreSource
from resurge.jobspec import TrainingJob
from resurge.runtime.kv_keys import bucket_keys

__all__ = [
    "COMPRESSED_ABOVE",
    "FIELD_GROUPS",
    "CheckpointRef",
    "CheckpointReports",
    "GpuOnNode",
    "HeldGrow",
    "JobEnding",
    "JobRecord",
    "JobStore",
    "LastFault",
    "LastRecovery",
    "LastResize",
    "Move",
    "PendingRecovery",
    "Placement",
    "RestartEntry",
    "RestoredState",
    "status_view",
]

_CAS_ATTEMPTS = 20
_RECORDS_REMEMBERED = 10_000
_HANDLED_FAULTS_KEPT = 64
COMPRESSED_ABOVE = 32 * 1024
"""A record whose JSON is longer is stored zlib-compressed."""


def _as_ranges(ranks: Iterable[int]) -> list[list[int]]:
    """Ascending ranks as ``[first, last]`` runs: 0..16383 is ``[[0, 16383]]``."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return runs


def _from_ranges(value: object) -> object:
    """Ranks stored as runs (or, as records before runs held them, one by one)."""
    if not isinstance(value, list) or not all(isinstance(v, list) for v in value):
        return value
    ranks: list[int] = []
    for run in value:
        if len(run) != 2 or not all(isinstance(end, int) for end in run) or run[0] > run[1]:
            raise ValueError(f"a run of ranks is [first, last], not {run!r}")
        ranks.extend(range(run[0], run[1] + 1))
    return ranks


Ranks = Annotated[
    list[int],
    BeforeValidator(_from_ranges),
    PlainSerializer(_as_ranges, return_type=list[list[int]], when_used="json"),
]
"""Ascending ranks, stored as ``[first, last]`` runs."""


class Placement(BaseModel):
    """Where one replica of the job runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replica: int = Field(ge=0, description="Replica index.")
    node: str = Field(description="Node the replica's worker group runs on.")
    address: str = Field(default="127.0.0.1", description="Address other replicas reach it at.")


class LastFault(BaseModel):
    """The newest fault the restarter acted on, in short."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault_id: str
    reason: str
    scope: str
    time: datetime


class Move(BaseModel):
    """A replica leaving a node at a `node` recovery."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replica: int = Field(ge=0)
    from_node: str
    to_node: str


class GpuOnNode(BaseModel):
    """One GPU of one node (a GPU a recovery resets)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    gpu: int = Field(ge=0)


class PendingRecovery(BaseModel):
    """A recovery decided but not yet seen to work (the new generation has not trained:
    no step past its resume point, or for workers that report none, no rendezvous).

    It is also the plan the restarter carries out: written with the decision (one
    compare-and-set), before any command goes out, so a restarter that dies mid-way
    leaves the plan for the next one. ``dispatched`` turns true once every command and
    cluster action of the plan went out; until then the restarter named in
    ``claimed_by`` carries it out, and after ``claimed_until`` any restarter may.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault_id: str
    level: RecoveryLevel
    reason: str = ""
    detected_at: datetime = Field(description="When the fault was detected.")
    from_generation: int = 0
    to_generation: int
    stop_placements: list[Placement] = Field(
        default_factory=list, description="Where the failed generation ran (to stop it)."
    )
    recreate: list[int] = Field(
        default_factory=list, description="Replicas whose worker group (pod) is recreated."
    )
    moves: list[Move] = Field(default_factory=list, description="Replicas moved to other nodes.")
    cordon: list[str] = Field(default_factory=list, description="Nodes to cordon.")
    hung_ranks: list[int] = Field(
        default_factory=list,
        description="Ranks judged hung: they cannot act on SIGTERM, so they are killed at once.",
    )
    requeue: bool = Field(
        default=False, description="No node to move to: release everything, wait as Pending."
    )
    reset_gpus: list[GpuOnNode] = Field(
        default_factory=list,
        description="GPUs reset between the Stop and the Assign (an XID that asks for a "
        "reset): the replicas on their nodes restart where they were.",
    )
    start_at: datetime = Field(description="Backoff: the new generation starts no earlier.")
    resize: str = Field(
        default="",
        description="Empty for a recovery from a fault; `grow`, `shrink` or `suspend` for a "
        "resize the scaler decided (carried out the same way; `recreate` then names the "
        "replicas added, `stop_placements` those stopped).",
    )
    dispatched: bool = False
    claimed_by: str = ""
    claimed_until: datetime | None = None


class JobEnding(BaseModel):
    """What a job that finished (Succeeded or Failed) still owes, written with its phase
    (one compare-and-set): the final Stop to every replica, the phase announced
    (PhaseChanged), its worker groups deleted (:mod:`resurge.control.decisions.job_end`). Each
    flag turns true once its step succeeded; until ``claimed_until`` the instance in
    ``claimed_by`` does the steps, after it any restarter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    previous: JobPhase = Field(description="The phase the job finished from.")
    reason: str = Field(description="Why it finished, as its final Stops say.")
    placements: list[Placement] = Field(
        default_factory=list,
        description="Where its worker groups are: its placements, and those a plan not yet "
        "carried out still had to stop.",
    )
    stopped: bool = Field(default=False, description="The final Stops are stored.")
    announced: bool = Field(default=False, description="PhaseChanged is stored.")
    released: bool = Field(default=False, description="Its worker groups are deleted.")
    claimed_by: str = ""
    claimed_until: datetime | None = None

    @property
    def done(self) -> bool:
        """Whether every step is done."""
        return self.stopped and self.announced and self.released


class LastRecovery(BaseModel):
    """The newest recovery that finished (the new generation trained)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault_id: str
    level: RecoveryLevel
    reason: str
    to_generation: int
    seconds: float = Field(
        ge=0, description="From the fault's detection to the new generation's training."
    )


class HeldGrow(BaseModel):
    """A grow the scaler holds back: to how many replicas, what holds it (the cool-down
    after a resize, the snooze after a restart, capacity still arriving), until when."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    to_replicas: int = Field(ge=1)
    why: str
    until: datetime


class LastResize(BaseModel):
    """The newest resize: when it was decided, from and to how many replicas, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    time: datetime = Field(description="When the scaler decided it.")
    resize: str = Field(description="`grow`, `shrink` or `suspend`.")
    from_replicas: int = Field(ge=0)
    to_replicas: int = Field(ge=0)
    why: str = ""
    to_generation: int = Field(ge=0)
    seconds: float | None = Field(
        default=None,
        ge=0,
        description="From the decision to the new generation's training: its first step, or "
        "its ranks passing their rendezvous (None until then, and for a suspension).",
    )


class RestartEntry(BaseModel):
    """One restart, kept while it is inside the job's evalPeriodSeconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    time: datetime
    level: RecoveryLevel
    signature: str = Field(
        description="What makes two faults 'the same fault': its reason and its place."
    )
    node: str | None = None
    node_scoped: bool = False
    to_generation: int | None = Field(
        default=None, description="The generation this restart started."
    )
    attempt: int = Field(
        default=1, ge=1, description="1 for a new incident; n for the n-th restart of one."
    )
    stalled: bool = Field(
        default=False,
        description="For a fault of the generation the restart before started, which got no "
        "further (no rendezvous, no step past its resume point, or the same fault again "
        "short of the furthest step the incident's generations reached): the restarts "
        "from the last one without this flag on are one incident, however long they take.",
    )
    reached: int | None = Field(
        default=None, description="The furthest step the failed generation completed, if known."
    )
    rendezvous: bool = Field(
        default=False, description="Whether the failed generation passed its rendezvous."
    )


class CheckpointRef(BaseModel):
    """A checkpoint: its training step and where it lies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0)
    path: str


class CheckpointReports(BaseModel):
    """The ranks of one generation that reported saving one step's checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int = Field(ge=0)
    world_size: int = Field(
        ge=1, description="Ranks in that generation: the step is complete once all reported it."
    )
    step: int = Field(ge=0)
    ranks: Ranks = Field(description="The ranks that reported it, ascending.")


class RestoredState(BaseModel):
    """Where one generation's ranks took their registered state from as it began, as
    they reported it (StateRestored): the ranks of each source, the step, and the words
    of the worst source (a fresh start over the disk over a peer over their own memory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generation: int = Field(ge=0)
    step: int | None = Field(
        default=None,
        ge=0,
        description="The step resumed from (ranks agree on it; where they did not, the "
        "lowest); None when every rank that reported started fresh.",
    )
    ranks: dict[RestoreSource, Ranks] = Field(
        default_factory=dict, description="Source -> the ranks that reported it, ascending."
    )
    detail: str = Field(default="", description="The worst source's words, as its first rank said.")
    sharded: bool = Field(
        default=False, description="Whether a rank said its state is cut in shards."
    )
    reshardable: bool = Field(
        default=False,
        description="Whether every rank that said its state is cut in shards also said "
        "they can be cut again for another world size.",
    )


FIELD_GROUPS: dict[str, tuple[str, ...]] = {
    "run": ("name", "uid", "spec", "submitted", "worker_domain"),
    "lifecycle": ("phase", "message", "updated"),
    "generation": (
        "generation",
        "placements",
        "spare_nodes",
        "master_port",
        "incarnations",
        "finished_replicas",
        "alive_since",
        "resume_step",
        "pending_recovery",
    ),
    "recoveries": (
        "restarts",
        "history",
        "avoid_nodes",
        "handled_faults",
        "last_fault",
        "ending",
        "last_recovery_seconds",
        "last_recovery",
    ),
    "size": ("target_replicas", "held_grow", "last_resize"),
    "workers": (
        "in_process_capable",
        "reports_progress",
        "progressed_generation",
        "rendezvous_generation",
        "latest_checkpoint",
        "checkpoint_reports",
        "restored",
    ),
}
"""The job record's fields by who writes them (see :class:`JobRecord`)."""


class JobRecord(BaseModel):
    """One job's lasting state: what the control plane decided for it.

    Its fields come in groups by who writes them (:data:`FIELD_GROUPS`, in this order):

    - the run, as submitted: the scaler on ``JobSubmitted`` (a running job submitted
      again changes only its monitoring settings);
    - its lifecycle: only through :func:`resurge.control.decisions.lifecycle.move_to`, by whichever
      service moves it; ``updated`` by the store on every write;
    - the current generation: whoever starts one: the scaler's admission and resizes, the
      restarter's recoveries, a local cluster's restart;
    - recoveries: the restarter's decisions and what they left;
    - its size: the scaler's;
    - what its workers showed: the restarter, from raw events.
    """

    model_config = ConfigDict(extra="forbid")

    # The run, as submitted.
    name: str
    uid: str = Field(
        default_factory=lambda: uuid.uuid4().hex,
        description="This record's own id: a job submitted again after a delete gets a "
        "new one (as a Kubernetes object's metadata.uid).",
    )
    spec: TrainingJob
    submitted: datetime = Field(default_factory=lambda: datetime.now(UTC))
    worker_domain: str | None = Field(
        default=None,
        description="The DNS domain its worker groups are reached under, each at "
        "<hostname>.<domain> (Kubernetes pod networking: the job's Service); none: at "
        "their node's address. The cluster backend's word at submission.",
    )

    # Its lifecycle.
    phase: JobPhase = JobPhase.PENDING
    message: str = ""
    updated: datetime = Field(default_factory=lambda: datetime.now(UTC))

    # The current generation.
    generation: int = 0
    placements: list[Placement] = Field(default_factory=list)
    spare_nodes: list[str] = Field(
        default_factory=list, description="Nodes held empty for this job's `node` recoveries."
    )
    master_port: int = 0
    incarnations: dict[int, int] = Field(
        default_factory=dict, description="Replica -> times its worker group was recreated."
    )
    finished_replicas: list[int] = Field(
        default_factory=list, description="Replicas whose workers all exited 0 this generation."
    )
    alive_since: datetime | None = Field(
        default=None, description="When the current generation's first worker started."
    )
    resume_step: int | None = Field(
        default=None, description="The checkpoint step the current generation resumed from."
    )
    pending_recovery: PendingRecovery | None = None

    # Recoveries.
    restarts: dict[RecoveryLevel, int] = Field(default_factory=dict)
    history: list[RestartEntry] = Field(
        default_factory=list, description="Restarts inside evalPeriodSeconds, oldest first."
    )
    avoid_nodes: list[str] = Field(
        default_factory=list, description="Nodes this job no longer uses (they faulted)."
    )
    handled_faults: list[str] = Field(
        default_factory=list, description="Most recent fault ids acted on, newest last."
    )
    last_fault: LastFault | None = None
    ending: JobEnding | None = Field(
        default=None, description="A finished job's last steps, and which are done."
    )
    last_recovery_seconds: float | None = None
    last_recovery: LastRecovery | None = None

    # Its size.
    target_replicas: int | None = Field(
        default=None, description="Replicas the scaler means the job to run with now."
    )
    held_grow: HeldGrow | None = Field(
        default=None, description="A grow free slots allow that a debounce holds back."
    )
    last_resize: LastResize | None = None

    # What its workers showed.
    in_process_capable: bool = Field(
        default=False, description="Its workers run under resurge.worker.restartable."
    )
    reports_progress: bool = Field(
        default=False, description="Its workers report progress (they use resurge.worker)."
    )
    progressed_generation: int | None = Field(
        default=None,
        description="Newest generation that completed a step past its resume point: the "
        "restart that started it fixed what it was for.",
    )
    rendezvous_generation: int | None = Field(
        default=None,
        description="Newest generation whose ranks all passed their rendezvous "
        "(init_process_group), as the agent hosting its store reported.",
    )
    latest_checkpoint: CheckpointRef | None = Field(
        default=None, description="Newest checkpoint every rank of the job reported saved."
    )
    checkpoint_reports: list[CheckpointReports] = Field(
        default_factory=list,
        description="Newer steps some ranks reported saved, per generation and world size; "
        "oldest step first.",
    )
    restored: RestoredState | None = Field(
        default=None,
        description="Where the newest generation whose ranks registered their state took it "
        "from (memory, peers, the disk).",
    )

    @field_validator("checkpoint_reports", mode="before")
    @classmethod
    def _unattributed_reports(cls, value: object) -> object:
        # A record written before reports were kept per generation holds {step: ranks}:
        # which generation those ranks were in is unknown, so they are not counted (the
        # ranks report their next checkpoint anew).
        return [] if isinstance(value, dict) else value

    @property
    def world_size(self) -> int:
        """Worker processes in the current generation: replicas times nprocPerNode."""
        return self.spec.spec.nproc_per_node * len(self.placements)

    @property
    def total_restarts(self) -> int:
        """Restarts so far, every level together."""
        return sum(self.restarts.values())

    def to_entry(self) -> bytes:
        """The record as its KV entry stores it (see the module docstring)."""
        text = self.model_dump_json().encode()
        return zlib.compress(text, 1) if len(text) > COMPRESSED_ABOVE else text

    @classmethod
    def from_entry(cls, value: bytes) -> Self:
        """The record a KV entry holds; ValueError (a ValidationError where it is JSON
        that does not validate) when it holds none."""
        if value[:1] != b"{":
            try:
                value = zlib.decompress(value)
            except zlib.error as error:
                raise ValueError(f"a job record entry is neither JSON nor zlib: {error}") from None
        return cls.model_validate_json(value)

    def copy_to_change(self) -> Self:
        """A copy to change: nothing in it is shared with this one.

        Made through JSON: at thousands of placements that is about twice as fast as a
        deep copy."""
        return self.model_validate_json(self.model_dump_json())

    def remember_fault(self, fault_id: str) -> None:
        """Note ``fault_id`` as acted on; only the newest few are kept."""
        self.handled_faults = [*self.handled_faults, fault_id][-_HANDLED_FAULTS_KEPT:]


class ConflictError(Exception):
    """The record changed between read and write more often than we retry."""


class JobStore:
    """Job records in their KV bucket, every write a compare-and-set."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self._latest: OrderedDict[str, tuple[JobRecord, int]] = OrderedDict()

    def remember(self, record: JobRecord, revision: int) -> None:
        """Note ``record`` at ``revision`` as its job's newest unless a newer one is known
        (the newest :data:`_RECORDS_REMEMBERED` jobs are kept)."""
        known = self._latest.get(record.name)
        if known is not None and known[1] >= revision:
            return
        self._latest[record.name] = (record, revision)
        self._latest.move_to_end(record.name)
        while len(self._latest) > _RECORDS_REMEMBERED:
            self._latest.popitem(last=False)

    def forget(self, name: str) -> None:
        """Drop what is remembered of job ``name`` (its record was deleted)."""
        self._latest.pop(name, None)

    def remembered(self, name: str) -> tuple[JobRecord, int] | None:
        """The newest record of ``name`` this store knows of and its revision, without
        reading; it may be stale (see the module docstring)."""
        return self._latest.get(name)

    @staticmethod
    def key(name: str) -> str:
        """The KV key of job ``name`` (escaped into one token)."""
        return escape_token(name)

    async def all(self) -> list[JobRecord]:
        """Every job's record."""
        records = []
        for key in await bucket_keys(self.kv):
            found = await self.get(unescape_token(key))
            if found is not None:
                records.append(found[0])
        return records

    async def get(self, name: str) -> tuple[JobRecord, int] | None:
        """Job ``name``'s record and its revision, or None when there is none."""
        try:
            entry = await self.kv.get(self.key(name))
        except nats.js.errors.KeyNotFoundError:
            return None
        if entry.value is None or entry.revision is None:
            return None
        record = JobRecord.from_entry(entry.value)
        self.remember(record, entry.revision)
        return record, entry.revision

    async def create(self, record: JobRecord) -> bool:
        """Store a new record; false if one by that name exists already."""
        try:
            written = await self.kv.create(self.key(record.name), record.to_entry())
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        self.remember(record, written)
        return True

    async def replace(self, record: JobRecord, revision: int) -> bool:
        """Overwrite the record read at ``revision``; false if it changed since."""
        try:
            written = await self.kv.update(self.key(record.name), record.to_entry(), last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        self.remember(record, written)
        return True

    async def mutate(
        self,
        name: str,
        change: Callable[[JobRecord], bool],
        *,
        read: tuple[JobRecord, int] | None = None,
    ) -> tuple[JobRecord, JobRecord] | None:
        """Apply ``change`` (which edits a copy and returns whether it changed anything).

        Returns ``(before, after)``, ``after`` being ``before`` when nothing changed, or
        ``None`` when no such job exists. Retries on a concurrent write. ``read``: the
        record and revision the caller just got (:meth:`get`), used for the first
        attempt instead of reading again; without it the first attempt starts from the
        remembered record, if any. The compare-and-set still refuses either if it is no
        longer the newest, and the next attempt reads; "nothing changed" is only
        believed of a record just read.
        """
        for attempt in range(_CAS_ATTEMPTS):
            fresh = True
            if attempt == 0 and read is not None:
                found: tuple[JobRecord, int] | None = read
            elif attempt == 0 and name in self._latest:
                found, fresh = self._latest[name], False
            else:
                found = await self.get(name)
            if found is None:
                return None
            before, revision = found
            after = before.copy_to_change()
            if not change(after):
                if not fresh:
                    continue
                return before, before
            after.updated = datetime.now(UTC)
            try:
                written = await self.kv.update(self.key(name), after.to_entry(), last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            self.remember(after, written)
            return before, after
        raise ConflictError(f"job record {name!r} kept changing under {_CAS_ATTEMPTS} attempts")


def _target(record: JobRecord) -> int:
    """The replicas the job is meant to run with: the scaler's target once it set one,
    else what it runs with, else (Pending) its ``min``."""
    if record.target_replicas is not None:
        return record.target_replicas
    return len(record.placements) or record.spec.spec.replicas.min


def status_view(record: JobRecord) -> dict[str, object]:
    """The ``resurge status --json`` object of DESIGN section 7."""
    fault = record.last_fault
    return {
        "name": record.name,
        "uid": record.uid,
        "submitted": record.submitted.isoformat(),
        "phase": record.phase.value,
        "generation": record.generation,
        "replicas": {
            "current": len(record.placements),
            "target": _target(record),
        },
        "restarts": {level.value: count for level, count in record.restarts.items()},
        "lastFault": None
        if fault is None
        else {"reason": fault.reason, "scope": fault.scope, "time": fault.time.isoformat()},
        "lastRecoverySeconds": record.last_recovery_seconds,
        "lastRecovery": None
        if record.last_recovery is None
        else {
            "level": record.last_recovery.level.value,
            "reason": record.last_recovery.reason,
            "seconds": record.last_recovery.seconds,
            "generation": record.last_recovery.to_generation,
        },
        "recovery": None
        if record.pending_recovery is None
        else {
            "level": record.pending_recovery.level.value,
            "reason": record.pending_recovery.reason,
            "toGeneration": record.pending_recovery.to_generation,
            "dispatched": record.pending_recovery.dispatched,
        },
        "lastResize": None
        if record.last_resize is None
        else {
            "resize": record.last_resize.resize,
            "from": record.last_resize.from_replicas,
            "to": record.last_resize.to_replicas,
            "why": record.last_resize.why,
            "time": record.last_resize.time.isoformat(),
            "seconds": record.last_resize.seconds,
        },
        "heldGrow": None
        if record.held_grow is None or record.phase.finished  # a finished job grows no more
        else {
            "to": record.held_grow.to_replicas,
            "why": record.held_grow.why,
            "until": record.held_grow.until.isoformat(),
        },
        "avoidNodes": record.avoid_nodes,
        "spareNodes": record.spare_nodes,
        "latestCheckpoint": None
        if record.latest_checkpoint is None
        else {"step": record.latest_checkpoint.step, "path": record.latest_checkpoint.path},
        "restored": None
        if record.restored is None
        else {
            "generation": record.restored.generation,
            "step": record.restored.step,
            "sources": {source: len(ranks) for source, ranks in record.restored.ranks.items()},
            "detail": record.restored.detail,
        },
        "message": record.message,
    }
