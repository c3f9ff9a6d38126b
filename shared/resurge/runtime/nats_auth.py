"""Who a connection is to NATS: its user and password, its reply inbox, its TLS.

A party proves its role with a user and password (docs/security.md): from a credentials
file (``RESURGE_NATS_CREDENTIALS``: JSON ``{"user": ..., "password": ...}``, readable
by its owner only; ``resurge up`` writes one per role) or from ``RESURGE_NATS_USER`` and
``RESURGE_NATS_PASSWORD`` (Kubernetes passes a Secret's keys so). With neither, the
connection is anonymous, which a server without users accepts.

Replies (JetStream API answers, acks of publishes, push-consumer deliveries) arrive on
the inbox subjects of the connection. An authenticated connection uses its own inbox
prefix, ``_INBOX_<user>``, so the server can let each user subscribe to its own
replies only, never to another's. With ``RESURGE_NATS_TLS_CA`` (and optionally a client
certificate and key) the connection is TLS.
"""

from __future__ import annotations

import json
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resurge.runtime.settings import Settings

__all__ = [
    "JOB_CREDENTIALS_DIR",
    "Credentials",
    "CredentialsError",
    "connect_options",
    "inbox_prefix",
    "read_credentials",
    "tls_context",
    "write_credentials",
]

# A local node monitor's: the folder where the credentials of each job's launch agents
# on its node appear (resurge.local.access); a RESURGE_NATS_ name, so no worker gets it.
JOB_CREDENTIALS_DIR = "RESURGE_NATS_JOB_CREDENTIALS_DIR"
# User names are one subject token, as they name the user's inbox prefix.
_USER = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
# Bits of a credentials file's mode nobody but its owner may have.
_NOT_OWNER = 0o077


class CredentialsError(ValueError):
    """A credentials file or setting that cannot be used; the message says why."""


@dataclass(frozen=True)
class Credentials:
    """One NATS user and its password."""

    user: str
    password: str

    def __post_init__(self) -> None:
        if not _USER.fullmatch(self.user):
            raise CredentialsError(
                f"NATS user {self.user!r} must be 1-128 letters, digits, '-' or '_'"
            )
        if not self.password:
            raise CredentialsError(f"NATS user {self.user!r} has an empty password")

    def __repr__(self) -> str:  # never print the password
        return f"Credentials(user={self.user!r})"


def inbox_prefix(user: str) -> str:
    """The inbox prefix of ``user``'s connections; the server lets it read only these."""
    return f"_INBOX_{user}"


def write_credentials(path: Path, credentials: Credentials) -> None:
    """Write ``credentials`` to ``path`` (mode 0600 from the start, replaced atomically)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"user": credentials.user, "password": credentials.password}, out)
        out.write("\n")
    tmp.replace(path)


def read_credentials(path: Path) -> Credentials:
    """The credentials in ``path``; :class:`CredentialsError` if it is missing, unreadable,
    not valid, or readable by others than its owner."""
    try:
        mode = path.stat().st_mode
        data = json.loads(path.read_text())
        credentials = Credentials(str(data["user"]), str(data["password"]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CredentialsError(f"cannot read NATS credentials from {path}: {error}") from None
    if mode & _NOT_OWNER:
        raise CredentialsError(
            f"NATS credentials file {path} is open to others (mode {mode & 0o777:o}); "
            f"`chmod 600 {path}`"
        )
    return credentials


def _credentials(settings: Settings) -> Credentials | None:
    if settings.nats_credentials is not None:
        return read_credentials(settings.nats_credentials)
    if settings.nats_user:
        password = settings.nats_password.get_secret_value() if settings.nats_password else ""
        return Credentials(settings.nats_user, password)
    return None


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """A client TLS context when a CA or a client certificate is configured, else None."""
    if settings.nats_tls_ca is None and settings.nats_tls_cert is None:
        return None
    context = ssl.create_default_context(
        cafile=str(settings.nats_tls_ca) if settings.nats_tls_ca else None
    )
    if settings.nats_tls_cert is not None:
        context.load_cert_chain(
            str(settings.nats_tls_cert),
            str(settings.nats_tls_key) if settings.nats_tls_key else None,
        )
    return context


def connect_options(settings: Settings) -> dict[str, Any]:
    """The nats.py ``connect`` arguments for ``settings``' user, inbox and TLS (none for
    an anonymous plain connection)."""
    options: dict[str, Any] = {}
    credentials = _credentials(settings)
    if credentials is not None:
        options["user"] = credentials.user
        options["password"] = credentials.password
        options["inbox_prefix"] = inbox_prefix(credentials.user)
    context = tls_context(settings)
    if context is not None:
        options["tls"] = context
    return options
