"""Every subscription of every service, declared once: what it reads, how, and why.

A :class:`Subscription` names its service, the stream family and subject it reads
(built by :class:`~resurge.contract.subjects.Subjects`, with the tokens a binding fills
in left open), how it reads (:class:`Reader`), its durable consumer or queue group,
the event kinds its handler takes, and in a few words what the service does with them.
Everything else derives from this table:

- a service binds a subscription by handing its entry to the bus
  (``Bus.bind(entry, handler, scope)``), so the subject, consumer name, start and
  expected kinds it uses are the declared ones;
- the NATS permissions of each role (:mod:`resurge.access.permissions`) grant what the role's
  entries need to bind, and nothing for a subscription that is not declared;
- the events reference (``docs/events.md``, ``docs/asyncapi.yaml``) says who reads
  each family, and lists every subscription;
- the subscriber property test (``tests/property/test_subscribers.py``) runs every entry
  against a real server.

A :class:`Scope` fills a binding's open tokens: a launch agent's job and replica, a
monitor's node, the detector's partition group. In permissions an open
token is a wildcard (an agent's node is narrowed to its own).

The contract layer imports nothing of the event models: kinds are named by their
``kind`` string (the bus maps them to models).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from resurge.contract.families import FAULT_GRADE_KINDS, RAW_TELEMETRY_KINDS, family, stream_of
from resurge.contract.subjects import NODE_LEVEL_JOB, Subjects, escape_token

__all__ = [
    "AGENT_SERVICES",
    "DETECTOR_FAULTS",
    "DETECTOR_RAW",
    "LAUNCH_COMMANDS",
    "MONITOR_COMMANDS",
    "RESTARTER_CHECKPOINTS",
    "RESTARTER_EXITS",
    "RESTARTER_FAULTS",
    "RESTARTER_GPU_RESETS",
    "RESTARTER_NODE_CHECKS",
    "RESTARTER_NODE_FAULTS",
    "RESTARTER_PROGRESS",
    "RESTARTER_RENDEZVOUS",
    "RESTARTER_RESTORED",
    "RESTARTER_SIGN_OF_LIFE",
    "SCALER_ACTIONS",
    "SCALER_CAPACITY",
    "SCALER_JOBS",
    "SCALER_RESIZE_AGENTS",
    "SUBSCRIPTIONS",
    "Reader",
    "Scope",
    "Subscription",
    "of_role",
    "role_of",
]

# The services whose NATS user is the node's agent user.
AGENT_SERVICES = ("node-agent", "node-monitor")


class Reader(StrEnum):
    """How a subscription reads its subject."""

    DURABLE = "durable"
    """A durable consumer (``Bus.consume``): one message at a time, acked after the
    handler; the service's instances share it (a queue group of the consumer's name)."""
    BATCHES = "batches"
    """A durable consumer read in batches (``Bus.consume_batches``), one ack per batch;
    each event's kind must be the subject's kind token."""
    WATCH = "watch"
    """A core subscription held while it matters (``Bus.subscribe``); nothing stored."""
    INBOX = "inbox"
    """A command inbox (``resurge.runtime.command_inbox``): a core subscription, caught up
    from the stream by direct gets; no consumer in the server."""


@dataclass(frozen=True)
class Scope:
    """What fills a subscription's open tokens for one binding (None: left open)."""

    job: str | None = None
    replica: int | None = None
    node: str | None = None
    group: str = ""  # the detector's consumer group: `detector` or `detector-<i>-of-<n>`


Build = Callable[[Subjects, Scope], str]


@dataclass(frozen=True)
class Subscription:
    """One subscription of one service (see the module docstring)."""

    service: str
    name: str
    family: str
    build: Build
    reader: Reader
    kinds: tuple[str, ...]
    reads: str
    durable: str = ""
    start: Literal["all", "new", "last_per_subject"] = "all"
    dead_letters: bool = True

    def __post_init__(self) -> None:
        carried = family(self.family).kinds
        stray = [k for k in self.kinds if k not in carried]
        if stray or not self.kinds:
            raise ValueError(f"{self.service}/{self.name}: kinds {stray} not on {self.family}")
        named = self.reader in (Reader.DURABLE, Reader.BATCHES)
        if named != bool(self.durable):
            what = "names" if named else "has no"
            raise ValueError(f"{self.service}/{self.name}: a {self.reader} reader {what} "
                             "a consumer or queue group")  # fmt: skip

    @property
    def stream(self) -> str:
        """The name of the stream its kinds are stored in (``Subjects.stream(name)``):
        the family's, or for raw kinds the fault-grade or the telemetry stream."""
        return stream_of(self.family, self.kinds).name

    @property
    def role(self) -> str:
        """The NATS role whose user the service connects as."""
        return role_of(self.service)

    def subject(self, subjects: Subjects, scope: Scope | None = None) -> str:
        """The subject (filter) of one binding; open tokens of ``scope`` are wildcards."""
        return self.build(subjects, scope or Scope())

    def consumer(self, scope: Scope | None = None) -> str:
        """The durable consumer's (or queue group's) name for one binding."""
        scope = scope or Scope()
        return self.durable.format(
            node="*" if scope.node is None else escape_token(scope.node),
            group=scope.group,
        )

    def scopes(self, scope: Scope | None = None) -> Iterator[Scope]:
        """The bindings ``scope`` makes (one)."""
        yield scope or Scope()


def role_of(service: str) -> str:
    """The NATS role of ``service`` (a node agent's, launch or monitor: ``agent``)."""
    return "agent" if service in AGENT_SERVICES else service


def _raw_kind(kind: str) -> Build:
    return lambda s, _: s.raw(None, kind, None)


DETECTOR_RAW = Subscription(
    "detector", "raw", "raw", lambda s, _: s.all("raw"), Reader.BATCHES,
    RAW_TELEMETRY_KINDS, durable="{group}",
    reads="the raw telemetry (its own stream), to the detectors that take its kind (a "
    "partition: the jobs it judges)",
)  # fmt: skip
DETECTOR_FAULTS = Subscription(
    "detector", "faults", "raw", lambda s, _: s.all("raw"), Reader.BATCHES,
    tuple(sorted(FAULT_GRADE_KINDS)), durable="{group}-faults",
    reads="the fault-grade raw kinds (their own stream: no telemetry queues in front), to "
    "the detectors that take their kind",
)  # fmt: skip

RESTARTER_FAULTS = Subscription(
    "restarter", "faults", "fault", lambda s, _: s.all("fault"), Reader.DURABLE,
    ("fault_detected",), durable="restarter",
    reads="decides the recovery and writes its plan into the job record, then carries it out",
)  # fmt: skip
RESTARTER_NODE_FAULTS = Subscription(
    "restarter", "node-faults", "fault", lambda s, _: s.all("fault"), Reader.DURABLE,
    ("fault_detected",), durable="restarter-node-ledger", dead_letters=False,
    reads="counts every fault the attribution table puts on a node into that node's score, "
    "across jobs; quarantines a node whose score reaches the threshold (a bad message is "
    "dead-lettered by the restarter's fault consumer)",
)  # fmt: skip
RESTARTER_SIGN_OF_LIFE = Subscription(
    "restarter", "sign-of-life", "raw", _raw_kind("process_started"), Reader.DURABLE,
    ("process_started",), durable="restarter-sign-of-life",
    reads="notes when a new generation's first worker started (it ends no recovery)",
)  # fmt: skip
RESTARTER_RENDEZVOUS = Subscription(
    "restarter", "rendezvous", "raw", _raw_kind("rendezvous_passed"), Reader.DURABLE,
    ("rendezvous_passed",), durable="restarter-rendezvous",
    reads="ends a recovery of a script that reports no progress",
)  # fmt: skip
RESTARTER_EXITS = Subscription(
    "restarter", "exits", "raw", _raw_kind("process_exited"), Reader.DURABLE,
    ("process_exited",), durable="restarter-exits",
    reads="a worker of a new generation that exits 0 on its own ends its recovery",
)  # fmt: skip
RESTARTER_PROGRESS = Subscription(
    "restarter", "progress", "raw", _raw_kind("progress"), Reader.BATCHES,
    ("progress",), durable="restarter-progress-batches", start="new",
    reads="a new generation's first step past its resume point ends its recovery",
)  # fmt: skip
RESTARTER_CHECKPOINTS = Subscription(
    "restarter", "checkpoints", "raw", _raw_kind("checkpoint_saved"), Reader.BATCHES,
    ("checkpoint_saved",), durable="restarter-checkpoint-batches",
    reads="counts each generation's saved checkpoints into the job's resume point, "
    "a batch of reports per write of the job's record",
)  # fmt: skip
RESTARTER_RESTORED = Subscription(
    "restarter", "restored", "raw", _raw_kind("restored"), Reader.BATCHES,
    ("restored",), durable="restarter-restored-batches",
    reads="records where the current generation's ranks took their state from, a batch "
    "of reports per write of the job's record",
)  # fmt: skip
RESTARTER_GPU_RESETS = Subscription(
    "restarter", "gpu-resets", "raw", lambda s, at: s.raw(NODE_LEVEL_JOB, "gpu_reset", at.node),
    Reader.WATCH, ("gpu_reset",),
    reads="between stopping a job's workers and starting them again: waits for the GPU "
    "resets it asked a node's monitor for",
)  # fmt: skip
RESTARTER_NODE_CHECKS = Subscription(
    "restarter", "node-checks", "raw", _raw_kind("node_checked"), Reader.DURABLE,
    ("node_checked",), durable="restarter-node-checks",
    reads="releases a quarantined node that passed the health check it was asked for",
)  # fmt: skip

SCALER_JOBS = Subscription(
    "scaler", "jobs", "job", lambda s, _: s.all("job"), Reader.DURABLE,
    ("job_submitted", "replica_finished", "job_deleted"), durable="scaler",
    reads="admits, finishes and deletes jobs",
)  # fmt: skip
SCALER_ACTIONS = Subscription(
    "scaler", "phases", "action", lambda s, _: s.action(None), Reader.DURABLE,
    ("phase_changed", "recovery_started", "recovery_finished", "scale_decided"),
    durable="scaler-phases",
    reads="frees and re-plans capacity as jobs change phase, recover and resize",
)  # fmt: skip
SCALER_CAPACITY = Subscription(
    "scaler", "capacity", "capacity", lambda s, _: s.all("capacity"), Reader.DURABLE,
    ("capacity_changed",), durable="scaler-capacity",
    reads="grows, shrinks and admits as nodes come, go and change health",
)  # fmt: skip
SCALER_RESIZE_AGENTS = Subscription(
    "scaler", "resize-agents", "raw", lambda s, at: s.raw(at.job, "agent_state", None),
    Reader.WATCH, ("agent_state",),
    reads="during a grow: waits until the replicas it adds say they are waiting",
)  # fmt: skip

LAUNCH_COMMANDS = Subscription(
    "node-agent", "commands", "cmd", lambda s, at: s.cmd(at.job, at.replica), Reader.INBOX,
    ("assign", "stop", "inject_fault", "checkpoint_now"),
    reads="a launch agent's commands: start, stop, fail on purpose, checkpoint its workers",
)  # fmt: skip
MONITOR_COMMANDS = Subscription(
    "node-monitor", "commands", "cmd", lambda s, at: s.node_cmd(at.node), Reader.DURABLE,
    ("inject_gpu_error", "repair_node", "reset_gpu", "check_node"), durable="monitor-{node}",
    start="new",
    reads="a node monitor's commands: raise a simulated XID, repair its node, reset GPUs, "
    "check its health",
)  # fmt: skip

SUBSCRIPTIONS: tuple[Subscription, ...] = (
    DETECTOR_RAW,
    DETECTOR_FAULTS,
    RESTARTER_FAULTS,
    RESTARTER_NODE_FAULTS,
    RESTARTER_SIGN_OF_LIFE,
    RESTARTER_RENDEZVOUS,
    RESTARTER_PROGRESS,
    RESTARTER_CHECKPOINTS,
    RESTARTER_RESTORED,
    RESTARTER_EXITS,
    RESTARTER_GPU_RESETS,
    RESTARTER_NODE_CHECKS,
    SCALER_JOBS,
    SCALER_ACTIONS,
    SCALER_CAPACITY,
    SCALER_RESIZE_AGENTS,
    LAUNCH_COMMANDS,
    MONITOR_COMMANDS,
)


def of_role(role: str) -> tuple[Subscription, ...]:
    """The subscriptions of the services that connect as ``role``."""
    return tuple(s for s in SUBSCRIPTIONS if s.role == role)
