"""Subject builders: the only place subject strings are spelled.

Every subject starts with a namespace token (``resurge`` by default; tests use one per
test) and the contract version ``v1``. Names taken from users or Kubernetes (jobs,
nodes) may hold dots, spaces or wildcards, which NATS treats as token separators or
filters; :func:`escape_token` maps any name to one safe token and
:func:`unescape_token` maps it back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "NODE_LEVEL_JOB",
    "RAW_KIND_TOKEN",
    "Subjects",
    "escape_token",
    "raw_subject_mismatch",
    "unescape_token",
]

VERSION = "v1"
# `<job>` token of raw events that belong to a node rather than a job (DESIGN section 2).
NODE_LEVEL_JOB = "_"
# Position of the `<kind>` token in a raw subject: <namespace>.v1.raw.<job>.<kind>.<node>
RAW_KIND_TOKEN = 4

_SAFE = re.compile(r"[A-Za-z0-9_-]")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def escape_token(name: str) -> str:
    """Map ``name`` to a single NATS token that is a safe subject and stream-name part.

    Letters, digits, ``-`` and ``_`` pass unchanged, except that ``_`` is doubled so the
    mapping can be reversed; every other character becomes ``_xx`` (two lower-case hex
    digits per UTF-8 byte). ``"a.b"`` becomes ``"a_2eb"``.
    """
    if not name:
        raise ValueError("a subject token cannot be empty")
    out: list[str] = []
    for char in name:
        if char == "_":
            out.append("__")
        elif _SAFE.fullmatch(char):
            out.append(char)
        else:
            out.extend(f"_{byte:02x}" for byte in char.encode())
    return "".join(out)


def unescape_token(token: str) -> str:
    """Invert :func:`escape_token`."""
    raw = bytearray()
    i = 0
    while i < len(token):
        char = token[i]
        if char != "_":
            raw.extend(char.encode())
            i += 1
        elif token[i + 1 : i + 2] == "_":
            raw.extend(b"_")
            i += 2
        else:
            raw.append(int(token[i + 1 : i + 3], 16))
            i += 3
    return raw.decode()


def _token_or_wildcard(name: str | None) -> str:
    return "*" if name is None else escape_token(name)


_FIXED = re.compile(r"^[a-z0-9_]{1,64}$")


def _fixed_or_wildcard(token: str | None) -> str:
    """A token from resurge's own fixed vocabulary (event kinds, scopes): used as it is."""
    if token is None:
        return "*"
    if not _FIXED.fullmatch(token):
        raise ValueError(f"{token!r} is not a fixed subject token (lower-case letters, digits, _)")
    return token


def raw_subject_mismatch(subject: str, job: str | None, node: str | None) -> str | None:
    """Why a raw event whose body names ``job`` and ``node`` does not belong on
    ``subject`` (``<namespace>.v1.raw.<job>.<kind>.<node>``), or None when it does, or
    when ``subject`` is not a raw subject.

    Publish permissions are given per subject (an agent: its own node's, or its own
    job's), so only the subject says who may have sent an event: a body naming another
    job or node than its subject is a forgery or a bug, never to be acted on. The job
    token ``_`` (a node-level event) goes with a body naming no job (or ``_``).
    """
    tokens = subject.split(".")
    if len(tokens) != 6 or tokens[2] != "raw":
        return None
    job_token, node_token = tokens[3], tokens[5]
    if job_token == NODE_LEVEL_JOB:
        if job not in (None, NODE_LEVEL_JOB):
            return f"the body names job {job!r}; the subject is node-level (job token '_')"
    elif job is None or _escaped(job) != job_token:
        return f"the body names job {job!r}; the subject's job is {_name(job_token)!r}"
    if node is None or _escaped(node) != node_token:
        return f"the body names node {node!r}; the subject's node is {_name(node_token)!r}"
    return None


# Every raw event a reader takes is checked: the few job and node names of a cluster are
# escaped once each (escaping char by char cost more than decoding the event).
_escaped = lru_cache(maxsize=4096)(escape_token)


def _name(token: str) -> str:
    """The name a subject token stands for; the token itself where it escapes nothing."""
    try:
        return unescape_token(token)
    except (ValueError, UnicodeDecodeError):
        return token


@dataclass(frozen=True)
class Subjects:
    """Subject and stream names under one namespace.

    A ``None`` argument becomes the ``*`` wildcard, so the same builder makes both the
    subject a message is published on and the filter a subscriber uses.
    """

    namespace: str = "resurge"

    def __post_init__(self) -> None:
        if not _NAMESPACE.fullmatch(self.namespace):
            raise ValueError(
                f"namespace {self.namespace!r} must be 1-64 letters, digits, '-' or '_'"
            )

    @property
    def root(self) -> str:
        """The first two tokens of every subject: ``<namespace>.v1``."""
        return f"{self.namespace}.{VERSION}"

    def raw(self, job: str | None, kind: str | None, node: str | None) -> str:
        """Node-agent telemetry; ``job`` is :data:`NODE_LEVEL_JOB` for node events."""
        job_token = NODE_LEVEL_JOB if job == NODE_LEVEL_JOB else _token_or_wildcard(job)
        kind_token = _fixed_or_wildcard(kind)
        return f"{self.root}.raw.{job_token}.{kind_token}.{_token_or_wildcard(node)}"

    def fault(self, job: str | None, scope: str | None) -> str:
        """Faults the detector found in ``job``, by ``scope`` (process, node, job)."""
        return f"{self.root}.fault.{_token_or_wildcard(job)}.{_fixed_or_wildcard(scope)}"

    def capacity(self, node: str | None) -> str:
        """One node's capacity as it changes: its slots, the free ones, its health."""
        return f"{self.root}.capacity.{_token_or_wildcard(node)}"

    def cmd(self, job: str | None, replica: int | None) -> str:
        """Commands to the agent of one replica of ``job`` (``None``: every replica)."""
        replica_token = "*" if replica is None else str(replica)
        return f"{self.root}.cmd.{_token_or_wildcard(job)}.{replica_token}"

    def node_cmd(self, node: str | None) -> str:
        """Commands to one node's monitor agent (``_`` never collides: job tokens escape it)."""
        return f"{self.root}.cmd.{NODE_LEVEL_JOB}.{_token_or_wildcard(node)}"

    def action(self, job: str | None) -> str:
        """What the control plane did to ``job``: recoveries begun and ended, phase changes."""
        return f"{self.root}.action.{_token_or_wildcard(job)}"

    def job(self, job: str | None) -> str:
        """The life of ``job``: submitted, deleted, a replica finished."""
        return f"{self.root}.job.{_token_or_wildcard(job)}"

    def dlq(self, service: str | None) -> str:
        """Messages ``service`` could not decode or handle, dead-lettered."""
        return f"{self.root}.dlq.{_token_or_wildcard(service)}"

    def access_renew(self) -> str:
        """Requests of a Kubernetes pod's agent for a new user JWT (core request-reply,
        no stream; docs/security.md, Credentials)."""
        return f"{self.root}.access.renew"

    def all(self, family: str) -> str:
        """Every subject of one family (``raw``, ``fault``, ...): ``<root>.<family>.>``."""
        return f"{self.root}.{family}.>"

    def stream(self, family: str) -> str:
        """The JetStream stream that stores one family of subjects."""
        return f"{self.namespace}_{family}".upper().replace("-", "_")

    def kv_bucket(self, name: str) -> str:
        """The JetStream KV bucket ``name`` of this namespace, e.g. ``resurge_jobs``."""
        return f"{self.namespace}_{name}".replace("-", "_")
