"""Who may say what on the bus: the NATS users of each role and their permissions.

Roles (docs/security.md has the table and the reasons):

- ``agent``: node agents (monitor and launch). A local node's monitor has one user,
  ``agent-<node>``, that publishes only raw subjects ending in its node; on Kubernetes
  one ``agent`` user serves every node (any node token). A launch agent of a local
  cluster has a user of its job on its node (:func:`job_agent_user`): it publishes only
  its job's raw kinds on its node, reads only its job's commands and writes only its
  own command positions, so a worker that steals them can lie about nothing else.
- ``detector``, ``restarter``, ``scaler``: the services; only restarter and scaler
  publish commands.
- ``viewer``: reads only (``resurge status``, ``events``, ``node list``).
- ``admin``: the CLI's writing commands and the local supervisor.

Permissions are lists of subjects each user may publish to and subscribe to (nothing
else: NATS denies whatever a user's allow list does not name). JetStream is reached
through subjects too: ``$JS.API.*`` requests (stream and consumer info and creation,
message gets), ``$JS.ACK.*`` acknowledgements, ``$JS.FC.*`` flow control, and writes
to KV buckets are publishes to ``$KV.<bucket>.<key>``. Every reply a user gets comes to
its own inbox prefix ``_INBOX_<user>`` (:mod:`resurge.runtime.nats_auth`), the only
inboxes it may subscribe to.

What each role may subscribe to comes from the subscriptions it declares
(:mod:`resurge.contract.subscriptions`); the server configs built from these
permissions are :mod:`resurge.access.server_config`'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from resurge.cluster.local.keys import (
    CORDONS_BUCKET,
    JOB_STATUS_BUCKET,
    NODES_BUCKET,
    WORKER_GROUPS_BUCKET,
    node_key,
)
from resurge.contract.families import RAW_JOB_KINDS, STREAM_NAMES
from resurge.contract.subjects import Subjects, escape_token
from resurge.contract.subscriptions import Reader, Scope, of_role
from resurge.runtime.bus import (
    AGENT_POSITIONS_BUCKET,
    ALLOCATIONS_BUCKET,
    JOBS_BUCKET,
    NODE_HEALTH_BUCKET,
)
from resurge.runtime.nats_auth import inbox_prefix

__all__ = [
    "DETECTOR_STATE_BUCKET",
    "ROLES",
    "Permissions",
    "agent_user",
    "covers",
    "job_agent_user",
    "role_permissions",
    "role_user",
]

ROLES = ("agent", "detector", "restarter", "scaler", "viewer", "admin")
# The detector's own bucket (resurge_detector.state_store.STATE_BUCKET: a service the
# shared library cannot import; a unit test keeps the two equal).
DETECTOR_STATE_BUCKET = "detector_state"
_STREAMS = STREAM_NAMES  # a family's stream, the raw family's two
_BUCKETS = (
    JOBS_BUCKET,
    NODES_BUCKET,
    CORDONS_BUCKET,
    WORKER_GROUPS_BUCKET,
    JOB_STATUS_BUCKET,
    DETECTOR_STATE_BUCKET,
    AGENT_POSITIONS_BUCKET,
    ALLOCATIONS_BUCKET,
    NODE_HEALTH_BUCKET,
)
_API = "$JS.API"


@dataclass(frozen=True)
class Permissions:
    """What one user may publish to and subscribe to (NATS allow lists)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    # May answer the requests it receives (publish once to each one's reply subject).
    responses: bool = False

    def as_config(self) -> dict[str, Any]:
        """The ``permissions`` object of a nats-server user."""
        config: dict[str, Any] = {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.responses:
            config["allow_responses"] = True
        return config


@dataclass
class _Grants:
    responses: bool = False
    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)

    def pub(self, *subjects: str) -> None:
        self.publish += [s for s in subjects if s not in self.publish]

    def sub(self, *subjects: str) -> None:
        self.subscribe += [s for s in subjects if s not in self.subscribe]


class _Namespace:
    """The subjects, streams and buckets of one namespace, as permissions name them."""

    def __init__(self, subjects: Subjects) -> None:
        self.s = subjects
        self.root = subjects.root

    def stream(self, name: str) -> str:
        return self.s.stream(name)

    def kv_stream(self, bucket: str) -> str:
        return f"KV_{self.s.kv_bucket(bucket)}"

    def all_streams(self) -> list[str]:
        return [self.stream(f) for f in _STREAMS] + [self.kv_stream(b) for b in _BUCKETS]

    def info(self, g: _Grants) -> None:
        """Read every stream's and bucket's configuration and state (not its messages)."""
        g.pub(*(f"{_API}.STREAM.INFO.{name}" for name in self.all_streams()))

    def manage(self, g: _Grants, *buckets: str) -> None:
        """Create and update the streams of every family, the agents' command positions
        and ``buckets`` (what ``Bus.ensure_streams`` makes)."""
        buckets = (*buckets, AGENT_POSITIONS_BUCKET)
        for name in [self.stream(f) for f in _STREAMS] + [self.kv_stream(b) for b in buckets]:
            g.pub(f"{_API}.STREAM.CREATE.{name}", f"{_API}.STREAM.UPDATE.{name}")

    def consume(self, g: _Grants, stream_name: str, filter_subject: str) -> None:
        """Bind and create named durable consumers of stream ``stream_name`` filtered on
        exactly ``filter_subject`` (a wildcard in it is allowed as a wildcard only), and ack."""
        stream = self.stream(stream_name)
        g.pub(
            f"{_API}.CONSUMER.INFO.{stream}.*",
            f"{_API}.CONSUMER.CREATE.{stream}.*.{filter_subject}",
            f"$JS.ACK.{stream}.>",
        )

    def commands(self, g: _Grants, node: str | None, job: str | None = None) -> None:
        """Read command subjects (``job``'s only, if given): live (core subscription)
        and stored (direct gets of the ``cmd`` stream: the newest on a command subject,
        or the next one after a sequence); keep a position per agent under ``node``'s
        keys (any node's for None; ``job``'s under them, if given) in ``agent_positions``."""
        stream = self.stream("cmd")
        g.sub(self.s.cmd(job, None))
        g.pub(f"{_API}.DIRECT.GET.{stream}", f"{_API}.DIRECT.GET.{stream}.{self.s.cmd(job, None)}")
        bucket = self.s.kv_bucket(AGENT_POSITIONS_BUCKET)
        own = f"{'*' if node is None else escape_token(node)}.>"
        if job is not None:
            own = f"{'*' if node is None else escape_token(node)}.{escape_token(job)}.>"
        g.pub(
            f"{_API}.DIRECT.GET.{self.kv_stream(AGENT_POSITIONS_BUCKET)}.$KV.{bucket}.{own}",
            f"$KV.{bucket}.{own}",
        )

    def kv_read(self, g: _Grants, bucket: str) -> None:
        """Get keys, list them and watch them (ephemeral ordered consumers)."""
        stream = self.kv_stream(bucket)
        g.pub(
            f"{_API}.STREAM.INFO.{stream}",
            f"{_API}.DIRECT.GET.{stream}.>",
            f"{_API}.STREAM.MSG.GET.{stream}",
            f"{_API}.CONSUMER.CREATE.{stream}",
            f"{_API}.CONSUMER.INFO.{stream}.*",
            f"{_API}.CONSUMER.DELETE.{stream}.*",
            f"$JS.FC.{stream}.>",
        )

    def history(self, g: _Grants) -> None:
        """Read every stream's stored events back (ephemeral ordered consumers)."""
        for name in _STREAMS:
            stream = self.stream(name)
            g.pub(
                f"{_API}.STREAM.INFO.{stream}",
                f"{_API}.CONSUMER.CREATE.{stream}",
                f"{_API}.CONSUMER.INFO.{stream}.*",
                f"{_API}.CONSUMER.DELETE.{stream}.*",
                f"$JS.FC.{stream}.>",
            )

    def kv_write(self, g: _Grants, bucket: str, key: str = ">") -> None:
        """Put, create, update, delete and purge ``key`` (default: every key)."""
        g.pub(f"$KV.{self.s.kv_bucket(bucket)}.{key}")

    def events(self, g: _Grants, *families: str) -> None:
        g.pub(*(self.s.all(f) for f in families))

    def dead_letters(self, g: _Grants, *services: str) -> None:
        g.pub(*(self.s.dlq(service) for service in services))


def covers(wide: str, narrow: str) -> bool:
    """Whether NATS subject pattern ``wide`` matches every subject ``narrow`` matches."""
    a, b = wide.split("."), narrow.split(".")
    for i, token in enumerate(a):
        if token == ">":
            return len(b) > i
        if i >= len(b) or b[i] == ">" or (token != "*" and (token != b[i])):
            return False
    return len(a) == len(b)


def _subscriptions(ns: _Namespace, g: _Grants, role: str, node: str | None) -> None:
    """What binding ``role``'s declared subscriptions takes (:mod:`resurge.contract.
    subscriptions`), open tokens as wildcards but an agent's node: a durable consumer
    per filter (none where another filter of the role's on that stream covers it), a
    core subscription for watching readers, the command inbox's reads."""
    filters: dict[str, list[str]] = {}
    for entry in of_role(role):
        for scope in entry.scopes(Scope(node=node)):
            subject = entry.subject(ns.s, scope)
            if entry.reader in (Reader.DURABLE, Reader.BATCHES):
                filters.setdefault(entry.stream, [])
                if subject not in filters[entry.stream]:
                    filters[entry.stream].append(subject)
            elif entry.reader is Reader.INBOX:
                ns.commands(g, node)
            else:
                g.sub(subject)
    for stream, subjects in filters.items():
        for subject in subjects:
            if not any(covers(other, subject) for other in subjects if other != subject):
                ns.consume(g, stream, subject)


def agent_user(node: str | None) -> str:
    """The user of ``node``'s agents (``agent-<node>``), or ``agent`` for every node."""
    return "agent" if node is None else f"agent-{escape_token(node)}"


def job_agent_user(node: str, job: str) -> str:
    """The user of ``job``'s launch agents on ``node``: ``agent-job-`` and a digest of
    both names (a NATS user name is short; job and node names need not be)."""
    digest = hashlib.sha256(f"{node}\0{job}".encode()).hexdigest()[:24]
    return f"agent-job-{digest}"


def _job_agent(ns: _Namespace, g: _Grants, node: str, job: str) -> None:
    """A launch agent of ``job`` on ``node``: its job's raw kinds on its node, its
    commands and positions, the buckets an agent reads; no node-level kind."""
    g.pub(*(ns.s.raw(job, kind, node) for kind in RAW_JOB_KINDS))
    g.pub(ns.s.access_renew())  # a Kubernetes pod's user asks for a new JWT
    ns.dead_letters(g, "node-agent")
    ns.commands(g, node, job)
    for bucket in (NODES_BUCKET, CORDONS_BUCKET, WORKER_GROUPS_BUCKET):
        ns.kv_read(g, bucket)


def _agent(ns: _Namespace, g: _Grants, node: str | None) -> None:
    subjects = ns.s
    node_token = "*" if node is None else escape_token(node)
    g.pub(f"{subjects.root}.raw.*.*.{node_token}")
    ns.dead_letters(g, "node-agent", "node-monitor")
    _subscriptions(ns, g, "agent", node)  # launch agents' commands, the monitor's
    for bucket in (NODES_BUCKET, CORDONS_BUCKET, WORKER_GROUPS_BUCKET):
        ns.kv_read(g, bucket)
    ns.kv_write(g, NODES_BUCKET, "*" if node is None else node_key(node))


def _detector(ns: _Namespace, g: _Grants, node: str | None) -> None:
    ns.manage(g, JOBS_BUCKET, DETECTOR_STATE_BUCKET)
    _subscriptions(ns, g, "detector", node)  # the telemetry stream, the fault-grade one
    ns.events(g, "fault", "job", "capacity")
    ns.dead_letters(g, "detector")
    ns.kv_read(g, JOBS_BUCKET)
    ns.kv_read(g, DETECTOR_STATE_BUCKET)
    ns.kv_write(g, DETECTOR_STATE_BUCKET)


def _control(ns: _Namespace, g: _Grants, role: str) -> None:
    """What restarter and scaler share: commands, the job records, the worker groups."""
    ns.manage(g, *_BUCKETS[:5], ALLOCATIONS_BUCKET)
    ns.events(g, "cmd", "action", "capacity")
    ns.dead_letters(g, role)
    for bucket in (*_BUCKETS[:5], ALLOCATIONS_BUCKET):
        ns.kv_read(g, bucket)
    for bucket in (
        JOBS_BUCKET,
        CORDONS_BUCKET,
        WORKER_GROUPS_BUCKET,
        JOB_STATUS_BUCKET,
        ALLOCATIONS_BUCKET,  # the placements they decide (resurge.control.state.allocations)
    ):
        ns.kv_write(g, bucket)


def _restarter(ns: _Namespace, g: _Grants, node: str | None) -> None:
    _control(ns, g, "restarter")
    ns.manage(g, NODE_HEALTH_BUCKET)  # the nodes' fault records, scores, quarantines
    ns.kv_read(g, NODE_HEALTH_BUCKET)
    ns.kv_write(g, NODE_HEALTH_BUCKET)
    _subscriptions(ns, g, "restarter", node)


def _scaler(ns: _Namespace, g: _Grants, node: str | None) -> None:
    _control(ns, g, "scaler")
    # On Kubernetes its controller submits and deletes the jobs of TrainingJobs.
    ns.events(g, "job")
    # Its Kubernetes controller answers pods' requests for a new user JWT (core
    # request-reply, not a declared event subscription).
    g.sub(ns.s.access_renew())
    g.responses = True
    _subscriptions(ns, g, "scaler", node)  # jobs, actions, capacity; agents during a grow


def _viewer(ns: _Namespace, g: _Grants, node: str | None) -> None:
    g.sub(f"{ns.root}.>")
    ns.history(g)  # `resurge events` and `resurge report` read the streams back
    # `node list` counts claims too; `node describe` shows a node's fault record.
    for bucket in (*_BUCKETS[:5], ALLOCATIONS_BUCKET, NODE_HEALTH_BUCKET):
        ns.kv_read(g, bucket)


def _admin(ns: _Namespace, g: _Grants, node: str | None) -> None:
    """A viewer that may also change the cluster (and run the local supervisor)."""
    _viewer(ns, g, node)
    ns.manage(g, *_BUCKETS[:5])
    for name in _STREAMS:  # the supervisor waits for the services' consumers
        g.pub(f"{_API}.CONSUMER.INFO.{ns.stream(name)}.*")
    # action: a local cluster started again announces the phase of each job it requeues.
    ns.events(g, "job", "cmd", "capacity", "action")
    ns.dead_letters(g, "cli", "supervisor")
    # Worker groups: a local cluster started again deletes the groups of the run before
    # (resurge.local.restore) before it requeues their jobs.
    # An operator's uncordon also releases a node's quarantine (its health record).
    for bucket in (
        JOBS_BUCKET,
        NODES_BUCKET,
        CORDONS_BUCKET,
        WORKER_GROUPS_BUCKET,
        NODE_HEALTH_BUCKET,
    ):
        ns.kv_write(g, bucket)


_ROLE_GRANTS = {
    "agent": _agent,
    "detector": _detector,
    "restarter": _restarter,
    "scaler": _scaler,
    "viewer": _viewer,
    "admin": _admin,
}


def role_user(role: str, node: str | None = None, job: str | None = None) -> str:
    """The NATS user name of ``role`` (narrowed as :func:`role_permissions`' arguments):
    the role's name, or an agent's (:func:`agent_user`, :func:`job_agent_user`)."""
    if role not in _ROLE_GRANTS:
        raise ValueError(f"no role {role!r} (roles: {', '.join(ROLES)})")
    if job is not None and (role != "agent" or node is None):
        raise ValueError("only an agent of one node has a user of one job")
    if job is not None and node is not None:
        return job_agent_user(node, job)
    return agent_user(node) if role == "agent" else role


def role_permissions(
    role: str, subjects: Subjects, node: str | None = None, job: str | None = None
) -> Permissions:
    """What ``role`` may publish and subscribe to under ``subjects``' namespace;
    ``node`` narrows an agent to one node's raw subjects and record (None: any node);
    ``node`` and ``job`` make it the launch agents' user of that job on that node."""
    user = role_user(role, node, job)
    ns = _Namespace(subjects)
    g = _Grants()
    g.sub(f"{inbox_prefix(user)}.>")
    ns.info(g)
    if job is not None and node is not None:
        _job_agent(ns, g, node, job)
    else:
        _ROLE_GRANTS[role](ns, g, node)
    return Permissions(tuple(g.publish), tuple(g.subscribe), g.responses)
