"""The control-plane chaos bench's judge: four invariants, checked at every sample.

The bench samples twice a second: the job records (the control plane's decisions), the
worker processes read from ``/proc`` (what really runs, where) and the recovery
events on the bus. :class:`Judge` keeps what it needs across samples and records each
broken invariant once per episode, with the bench's time and a detail:

- **slots**: no node holds more workers than it has slots: the records' placements of
  the unfinished jobs at every sample; the processes once a node has been over for
  longer than :data:`OVERLAP_GRACE_SECONDS` (a replaced worker may still be stopping
  while its successor starts);
- **recovered once**: each injected fault that breaks a job is followed, within
  :data:`RECOVERY_LIMIT_SECONDS`, by a recovery of that job (unless the job finished
  first), and no fault and no generation of a job is recovered twice;
- **Recovering**: no job stays Recovering longer than :func:`recovering_limit` (its
  backoff, its startup and the longest disturbance the bench makes, with room);
- **finished**: no worker of a job that finished (or was deleted) runs
  :data:`FINISHED_GRACE_SECONDS` after the bench first saw it finished.

Standard library and the project's models only; the bench makes the faults.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from resurge.control.state.records import JobRecord
from resurge.events import JobPhase, RecoveryStarted

__all__ = [
    "FINISHED_GRACE_SECONDS",
    "LONGEST_PARTITION_SECONDS",
    "OVERLAP_GRACE_SECONDS",
    "RECOVERY_LIMIT_SECONDS",
    "Broken",
    "Judge",
    "Worker",
    "census",
    "recovering_limit",
]

# The longest the bench partitions a link, and the longest it disturbs one at all.
LONGEST_PARTITION_SECONDS = 15.0
LONGEST_DISTURBANCE_SECONDS = 20.0
# A worker asked to stop has its job's stopGraceSeconds (the default, 10 s, in the
# bench's jobs), then SIGKILL; its agent may hear the Stop only once a partition heals.
FINISHED_GRACE_SECONDS = 10.0 + LONGEST_PARTITION_SECONDS + 10.0
OVERLAP_GRACE_SECONDS = FINISHED_GRACE_SECONDS
# From an injected fault to the recovery it causes, worst case: a hang's heartbeat
# timeout, a disturbed link's reconnect, the backoff.
RECOVERY_LIMIT_SECONDS = 60.0


def recovering_limit(record: JobRecord) -> float:
    """How long ``record``'s job may stay Recovering: its longest backoff, its startup
    (the heartbeat timeout or 60 s), the longest disturbance, and 30 s of room."""
    spec = record.spec.spec
    backoff = spec.recovery.backoff.max_seconds
    startup = spec.monitoring.startup_timeout_seconds or 60.0
    return backoff + startup + LONGEST_DISTURBANCE_SECONDS + 30.0


@dataclass(frozen=True)
class Worker:
    """One worker process of the bench's: its job and the node it runs under."""

    pid: int
    job: str
    node: str | None
    state: str  # as /proc/PID/stat says: T is stopped (a hang)
    parent: int


@dataclass(frozen=True)
class Broken:
    """One broken invariant: when (seconds into the run), which, and what."""

    at: float
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"t={self.at:7.1f}s {self.invariant}: {self.detail}"


def census(marker: str, monitors: dict[int, str]) -> list[Worker]:
    """Every live process whose command line holds ``marker`` and ``--job NAME``, with
    the node whose monitor (``monitors``: pid -> node) it runs under."""
    parents: dict[int, int] = {}
    found: list[tuple[int, str, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            pid = int(entry.name)
            parents[pid] = int(fields[1])
            if fields[0] in ("Z", "X"):
                continue
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if any(marker in arg for arg in argv) and "--job" in argv:
                found.append((pid, argv[argv.index("--job") + 1], fields[0]))
    workers = []
    for pid, job, state in found:
        node, up = None, pid
        for _ in range(64):
            if up in monitors:
                node = monitors[up]
                break
            up = parents.get(up, 1)
            if up <= 1:
                break
        workers.append(Worker(pid, job, node, state, parents.get(pid, 0)))
    return workers


@dataclass
class _Injected:
    kind: str
    job: str
    at: float
    recovered: bool = False
    by: str = ""  # the recovery's reason and when it started


@dataclass
class Judge:
    """The invariants' state across samples, and what broke."""

    broken: list[Broken] = field(default_factory=list)
    injected: list[_Injected] = field(default_factory=list)
    recoveries: list[tuple[float, RecoveryStarted]] = field(default_factory=list)
    _over: dict[str, float] = field(default_factory=dict)  # node -> over capacity since
    _recovering: dict[str, float] = field(default_factory=dict)  # job -> Recovering since
    _finished: dict[str, float] = field(default_factory=dict)  # job -> seen finished at
    _said: set[tuple[str, str]] = field(default_factory=set)  # (invariant, key) reported
    samples: int = 0

    def _break(self, at: float, invariant: str, key: str, detail: str) -> None:
        if (invariant, key) not in self._said:
            self._said.add((invariant, key))
            self.broken.append(Broken(at, invariant, detail))
            print(f"  BROKEN {self.broken[-1]}", flush=True)

    def inject(self, kind: str, job: str, at: float) -> None:
        """A fault that breaks ``job`` was made at ``at``."""
        self.injected.append(_Injected(kind, job, at))

    def recovery(self, at: float, event: RecoveryStarted) -> None:
        """A RecoveryStarted arrived at ``at``: the first after an injection into its job
        recovers it; a fault or generation recovered twice is broken. A publisher's
        retry of the same event (same id: core NATS passes both on, the stream keeps
        one) counts once."""
        if any(r.id == event.id for _, r in self.recoveries):
            return
        self.recoveries.append((at, event))
        for injected in self.injected:
            if injected.job == event.job and not injected.recovered and injected.at <= at:
                injected.recovered = True
                injected.by = f"{event.reason} at t={at:.1f}s ({event.level})"
        twice = Counter(r.fault_id for _, r in self.recoveries if r.job == event.job)
        if twice[event.fault_id] > 1:
            self._break(at, "recovered once", f"fault {event.fault_id}",
                        f"{event.job}: fault {event.fault_id} ({event.reason}) recovered "
                        f"{twice[event.fault_id]} times")  # fmt: skip
        generations = Counter(
            (r.job, r.from_generation) for _, r in self.recoveries if r.job == event.job
        )
        if generations[(event.job, event.from_generation)] > 1:
            self._break(at, "recovered once", f"{event.job} g{event.from_generation}",
                        f"{event.job}: generation {event.from_generation} recovered twice "
                        f"(the second for {event.reason})")  # fmt: skip

    def sample(
        self, at: float, records: list[JobRecord], workers: list[Worker], slots: dict[str, int]
    ) -> None:
        """Judge one moment: the records, the worker processes, each node's slots."""
        self.samples += 1
        self._slots(at, records, workers, slots)
        self._phases(at, records, workers)
        for injected in self.injected:
            late = at - injected.at > RECOVERY_LIMIT_SECONDS
            if late and not injected.recovered and injected.job not in self._finished:
                self._break(at, "recovered once", f"{injected.kind}@{injected.at:.1f}",
                            f"{injected.kind} into {injected.job} at t={injected.at:.1f}s: "
                            f"no recovery within {RECOVERY_LIMIT_SECONDS:g} s")  # fmt: skip

    def _slots(
        self, at: float, records: list[JobRecord], workers: list[Worker], slots: dict[str, int]
    ) -> None:
        placed: Counter[str] = Counter()
        holders: dict[str, list[str]] = {}
        for record in records:
            if record.phase.finished:
                continue
            for placement in record.placements:
                placed[placement.node] += record.spec.spec.nproc_per_node
                holders.setdefault(placement.node, []).append(record.name)
        for node, count in placed.items():
            if node in slots and count > slots[node]:
                self._break(at, "slots", f"placed {node} {sorted(holders[node])}",
                            f"the records place {count} workers on {node} "
                            f"({slots[node]} slots): {sorted(holders[node])}")  # fmt: skip
        running = Counter(w.node for w in workers if w.node is not None)
        for node, count in running.items():
            if node not in slots or count <= slots[node]:
                self._over.pop(node, None)
                continue
            since = self._over.setdefault(node, at)
            if at - since > OVERLAP_GRACE_SECONDS:
                jobs = sorted(w.job for w in workers if w.node == node)
                self._break(at, "slots", f"running {node} {since:.0f}",
                            f"{count} workers run on {node} ({slots[node]} slots) since "
                            f"t={since:.1f}s: {jobs}")  # fmt: skip
        for node in set(self._over) - set(running):
            del self._over[node]

    def _phases(self, at: float, records: list[JobRecord], workers: list[Worker]) -> None:
        present = {record.name for record in records}
        for record in records:
            if record.phase is JobPhase.RECOVERING:
                since = self._recovering.setdefault(record.name, at)
                limit = recovering_limit(record)
                if at - since > limit:
                    self._break(at, "Recovering", f"{record.name} {since:.0f}",
                                f"{record.name} Recovering since t={since:.1f}s, past its "
                                f"{limit:g} s (generation {record.generation})")  # fmt: skip
            else:
                self._recovering.pop(record.name, None)
        for name in list(self._recovering):
            if name not in present:
                del self._recovering[name]
        over = {r.name for r in records if r.phase.finished}
        over |= {w.job for w in workers} - present  # deleted: as finished
        for job in set(self._finished) - over:  # a record read amiss once: judged anew
            del self._finished[job]
        for job in over:
            self._finished.setdefault(job, at)
        for job, since in self._finished.items():
            left = sorted(w.pid for w in workers if w.job == job)
            if left and at - since > FINISHED_GRACE_SECONDS:
                self._break(at, "finished", job,
                            f"{job} finished at t={since:.1f}s and its workers {left} still "
                            f"run {at - since:.0f} s later")  # fmt: skip
