"""A local cluster's NATS users: :class:`LocalAccess` keeps them in its state folder: one
credentials file per role (and per node agent, and per job on a node for its launch
agents) under ``credentials/`` (folder 0700, files 0600), and the server's
``authorization`` block in ``nats/auth.conf`` (0600). Who may say what is
:mod:`resurge.access`'s.

The (node, job) pairs with a user are listed in ``credentials/job-agents.json``. A new
pair's credentials are written first under a hidden name (``.<user>.pending.json``),
the server's config with its user next; once the server has taken it,
:meth:`LocalAccess.job_agent_ready` puts the file at its own name, which is what a
node's monitor waits for before it starts the job's launch agent.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from resurge.access.permissions import ROLES, agent_user, job_agent_user, role_permissions
from resurge.access.server_config import authorization_block
from resurge.contract.subjects import Subjects
from resurge.local.state import credentials_path
from resurge.runtime.nats_auth import Credentials, read_credentials, write_credentials

__all__ = ["LocalAccess"]


class LocalAccess:
    """A local cluster's NATS users: credentials files and the server's config.

    Passwords are made once per state folder and kept (a CLI command or a node agent
    started by an earlier run of the folder goes on working); a node gets its agent user
    when it is first added (:meth:`add_node`)."""

    def __init__(self, state_dir: Path, subjects: Subjects) -> None:
        self.state_dir = state_dir
        self.subjects = subjects
        self.folder = state_dir / "credentials"
        self.config_path = state_dir / "nats" / "auth.conf"

    @staticmethod
    def credentials_file(state_dir: Path, role: str, node: str | None = None) -> Path:
        """Where the credentials of ``role`` (an agent: ``node``'s) live in ``state_dir``."""
        return credentials_path(state_dir, agent_user(node) if role == "agent" else role)

    def path(self, role: str, node: str | None = None) -> Path:
        """The credentials file of ``role`` (an agent: of ``node``'s agents)."""
        return self.credentials_file(self.state_dir, role, node)

    def _ensure(self, path: Path, user: str) -> None:
        if not path.exists():
            write_credentials(path, Credentials(user, secrets.token_urlsafe(32)))

    def prepare(self, nodes: Iterable[str]) -> None:
        """Make the folders private and every role's credentials (and each node's agent
        user) that is missing."""
        for folder in (self.state_dir, self.folder, self.config_path.parent):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o700)
        for role in ROLES:
            if role != "agent":
                self._ensure(self.path(role), role)
        for node in nodes:
            self._ensure(self.path("agent", node), agent_user(node))

    def add_node(self, node: str) -> bool:
        """Make ``node``'s agent user if it has none; True when it is new."""
        path = self.path("agent", node)
        if path.exists():
            return False
        self._ensure(path, agent_user(node))
        return True

    @property
    def _registry(self) -> Path:
        return self.folder / "job-agents.json"

    def job_agents(self) -> list[tuple[str, str]]:
        """The (node, job) pairs that have a user of their own."""
        if not self._registry.exists():
            return []
        return [(node, job) for node, job in json.loads(self._registry.read_text())]

    def job_agent_path(self, node: str, job: str) -> Path:
        """The credentials file of ``job``'s launch agents on ``node`` (there once ready)."""
        return credentials_path(self.state_dir, job_agent_user(node, job))

    def _pending(self, node: str, job: str) -> Path:
        path = self.job_agent_path(node, job)
        return path.with_name(f".{path.stem}.pending.json")

    def add_job_agent(self, node: str, job: str) -> bool:
        """Make the user of ``job``'s launch agents on ``node`` (its file still pending)
        unless it has one; True when it is new."""
        pairs = self.job_agents()
        if (node, job) in pairs:
            return False
        write_credentials(
            self._pending(node, job),
            Credentials(job_agent_user(node, job), secrets.token_urlsafe(32)),
        )
        tmp = self._registry.with_name(f".{self._registry.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump([list(pair) for pair in [*pairs, (node, job)]], out)
        tmp.replace(self._registry)
        return True

    def job_agent_ready(self, node: str, job: str) -> Path:
        """Put the pending credentials of (``node``, ``job``) at their own name."""
        path = self.job_agent_path(node, job)
        pending = self._pending(node, job)
        if pending.exists():
            pending.replace(path)
        return path

    def job_agent_file(self, node: str, job: str) -> Path:
        """Where the credentials of (``node``, ``job``) are now: ready, or pending."""
        path = self.job_agent_path(node, job)
        return path if path.exists() else self._pending(node, job)

    def _job_agent_credentials(self, node: str, job: str) -> Credentials:
        return read_credentials(self.job_agent_file(node, job))

    def write_config(self, nodes: Iterable[str], tls: str = "") -> Path:
        """Write the server's ``authorization`` (and ``tls``) config (mode 0600)."""
        users: list[tuple[str, str | None]] = [(role, None) for role in ROLES if role != "agent"]
        users += [("agent", node) for node in nodes]
        entries = []
        for role, node in users:
            credentials = read_credentials(self.path(role, node))
            permissions = role_permissions(role, self.subjects, node)
            entries.append((credentials.user, credentials.password, permissions))
        for node, job in self.job_agents():
            credentials = self._job_agent_credentials(node, job)
            permissions = role_permissions("agent", self.subjects, node, job)
            entries.append((credentials.user, credentials.password, permissions))
        text = authorization_block(entries) + tls
        tmp = self.config_path.with_name(f".{self.config_path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        tmp.replace(self.config_path)
        return self.config_path
