"""Who a connection is to NATS: its user and password or its user JWT, its reply inbox,
its TLS.

A party proves its role with a user and password (docs/security.md): from a credentials
file (``RESURGE_NATS_CREDENTIALS``: JSON ``{"user": ..., "password": ...}``, readable
by its owner only; ``resurge up`` writes one per role) or from ``RESURGE_NATS_USER`` and
``RESURGE_NATS_PASSWORD``. Or it proves it with NATS user credentials (a user JWT and
its nkey seed, a server in operator mode: :mod:`resurge.access.nats_jwt`): the same
``RESURGE_NATS_CREDENTIALS`` naming a standard decorated ``.creds`` file instead (told
apart by its content, the same owner-only rule), or ``RESURGE_NATS_CREDS`` holding such a
file's text (how a Kubernetes Secret's key is passed in). With none, the connection is
anonymous, which a server without users accepts.

Replies (JetStream API answers, acks of publishes, push-consumer deliveries) arrive on
the inbox subjects of the connection. An authenticated connection uses its own inbox
prefix, ``_INBOX_<user>`` (with a user JWT, its ``name``), so the server can let each
user subscribe to its own replies only, never to another's. With
``RESURGE_NATS_TLS_CA`` (and optionally a client certificate and key) the connection
is TLS.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import RawCredentials

from resurge.runtime.settings import Settings

__all__ = [
    "JOB_CREDENTIALS_DIR",
    "USER_JWT_BEGIN",
    "Credentials",
    "CredentialsError",
    "UserCredentials",
    "connect_options",
    "inbox_prefix",
    "jwt_claims",
    "read_credentials",
    "read_user_credentials",
    "tls_context",
    "user_credentials_of",
    "write_credentials",
]

# A local node monitor's: the folder where the credentials of each job's launch agents
# on its node appear (resurge.local.access); a RESURGE_NATS_ name, so no worker gets it.
JOB_CREDENTIALS_DIR = "RESURGE_NATS_JOB_CREDENTIALS_DIR"
# User names are one subject token, as they name the user's inbox prefix.
_USER = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
# Bits of a credentials file's mode nobody but its owner may have.
_NOT_OWNER = 0o077
# The line before a user JWT in a decorated .creds file (nats.py looks for it; a file
# without it would have nats.py read lines for ever).
USER_JWT_BEGIN = "-----BEGIN NATS USER JWT-----"
_USER_SEED_BEGIN = "-----BEGIN USER NKEY SEED-----"


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


@dataclass(frozen=True)
class UserCredentials:
    """A NATS user JWT and its nkey seed, as a decorated ``.creds`` text; ``user`` is
    the JWT's ``name`` (the user's name in resurge: its inbox prefix); ``path`` the file
    it was read from, if any (nats.py reads a file again at each reconnect, so a JWT
    renewed in place, as Kubernetes updates a mounted Secret, is taken in)."""

    user: str
    text: str
    path: Path | None = None

    def __repr__(self) -> str:  # never print the seed
        return f"UserCredentials(user={self.user!r})"


def _unpadded_b64url(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def jwt_claims(token: str) -> dict[str, Any]:
    """The claims of a NATS JWT, not verified (what the server verifies; a party reads
    its own JWT's ``name`` and ``exp``); :class:`CredentialsError` if it is not a JWT."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise CredentialsError("not a JWT: it has no three '.'-separated parts")
    try:
        claims = json.loads(_unpadded_b64url(parts[1]))
    except (ValueError, binascii.Error) as error:
        raise CredentialsError(f"the JWT's claims are unreadable: {error}") from None
    if not isinstance(claims, dict):
        raise CredentialsError("the JWT's claims are not a JSON object")
    return claims


def _block(text: str, begin: str) -> str | None:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if begin in line:
            return lines[i + 1].strip() if i + 1 < len(lines) else ""
    return None


def user_credentials_of(text: str, where: str) -> UserCredentials:
    """The user credentials in a decorated ``.creds`` ``text`` (from ``where``, named in
    errors); :class:`CredentialsError` if it has no user JWT or seed, the JWT is
    unreadable, or its claims name no user fit for an inbox prefix."""
    token = _block(text, USER_JWT_BEGIN)
    if not token:
        raise CredentialsError(f"{where} holds no NATS user JWT ({USER_JWT_BEGIN!r} line)")
    if not _block(text, _USER_SEED_BEGIN):
        raise CredentialsError(f"{where} holds no user nkey seed ({_USER_SEED_BEGIN!r} line)")
    try:
        claims = jwt_claims(token)
    except CredentialsError as error:
        raise CredentialsError(f"{where}: {error}") from None
    name = claims.get("name")
    if not isinstance(name, str) or not _USER.fullmatch(name):
        raise CredentialsError(
            f"{where}: the user JWT's name {name!r} is not a user name "
            "(1-128 letters, digits, '-' or '_')"
        )
    return UserCredentials(name, text)


def read_user_credentials(path: Path) -> UserCredentials:
    """The user credentials in the ``.creds`` file ``path``; :class:`CredentialsError` as
    :func:`read_credentials`'s, and as :func:`user_credentials_of`'s."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except (OSError, ValueError) as error:
        raise CredentialsError(f"cannot read NATS credentials from {path}: {error}") from None
    if mode & _NOT_OWNER:
        raise CredentialsError(
            f"NATS credentials file {path} is open to others (mode {mode & 0o777:o}); "
            f"`chmod 600 {path}`"
        )
    credentials = user_credentials_of(text, str(path))
    return UserCredentials(credentials.user, text, path)


def _is_user_credentials(path: Path) -> bool:
    try:
        return USER_JWT_BEGIN in path.read_text()
    except (OSError, ValueError):
        return False  # read_credentials says why


def _credentials(settings: Settings) -> Credentials | UserCredentials | None:
    if settings.nats_creds is not None:
        return user_credentials_of(settings.nats_creds.get_secret_value(), "RESURGE_NATS_CREDS")
    if settings.nats_credentials is not None:
        if _is_user_credentials(settings.nats_credentials):
            return read_user_credentials(settings.nats_credentials)
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
    if isinstance(credentials, UserCredentials):
        options["user_credentials"] = (
            str(credentials.path) if credentials.path else RawCredentials(credentials.text)
        )
        options["inbox_prefix"] = inbox_prefix(credentials.user)
    elif credentials is not None:
        options["user"] = credentials.user
        options["password"] = credentials.password
        options["inbox_prefix"] = inbox_prefix(credentials.user)
    context = tls_context(settings)
    if context is not None:
        options["tls"] = context
    return options
