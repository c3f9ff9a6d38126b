"""A local cluster's NATS users: :class:`LocalAccess` keeps them in its state folder: one
credentials file per role (and per node agent) under ``credentials/`` (folder 0700,
files 0600), and the server's ``authorization`` block in ``nats/auth.conf`` (0600). Who
may say what is :mod:`resurge.access`'s.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from resurge.access.permissions import ROLES, agent_user, role_permissions
from resurge.access.server_config import authorization_block
from resurge.contract.subjects import Subjects
from resurge.local.state import credentials_path
from resurge.runtime.nats_auth import Credentials, write_credentials

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

    def write_config(self, nodes: Iterable[str], tls: str = "") -> Path:
        """Write the server's ``authorization`` (and ``tls``) config (mode 0600)."""
        from resurge.runtime.nats_auth import read_credentials

        users: list[tuple[str, str | None]] = [(role, None) for role in ROLES if role != "agent"]
        users += [("agent", node) for node in nodes]
        entries = []
        for role, node in users:
            credentials = read_credentials(self.path(role, node))
            permissions = role_permissions(role, self.subjects, node)
            entries.append((credentials.user, credentials.password, permissions))
        text = authorization_block(entries) + tls
        tmp = self.config_path.with_name(f".{self.config_path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        tmp.replace(self.config_path)
        return self.config_path
