"""NATS decentralized auth: nkeys, and the JWTs an operator-mode nats-server trusts.

In operator mode a server trusts one operator (its JWT is in the server's config). The
operator signs account JWTs; an account's key, or one of its signing keys, signs user
JWTs; a client proves it is a user by presenting the user JWT and signing the server's
nonce with the user's nkey (both in the user's ``.creds`` file, :func:`creds`). A user's
permissions are in its JWT, so a new user needs no change to the server.

The JWTs are NATS JWT v2 (github.com/nats-io/jwt/v2), encoded here by hand: header
``{"typ":"JWT","alg":"ed25519-nkey"}``, claims and header as unpadded base64url, the
signature the issuer's ed25519 signature of ``"<header>.<claims>"``; ``jti`` is the
unpadded base32 of the SHA-512/256 of the claims' JSON without ``jti``, as that library
makes it. (The PyPI ``nats-jwt`` package says itself it is untested and pins an old
``pytz``, so it is not used.) Keys are the official ``nkeys`` package's.

The claims each kind carries are those nats-server reads: :func:`operator_jwt`,
:func:`account_jwt` (limits unlimited, JetStream included), :func:`user_jwt` (publish
and subscribe allow lists of :class:`~resurge.access.permissions.Permissions`).
:func:`jwt_claims` reads a JWT's claims unverified, :func:`verified_claims` checks its
signature first.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

import nacl.exceptions
import nacl.signing
import nkeys

from resurge.access.permissions import Permissions
from resurge.runtime.nats_auth import USER_JWT_BEGIN, jwt_claims

__all__ = [
    "NKey",
    "account_jwt",
    "creds",
    "encode_jwt",
    "jwt_claims",
    "jwt_id",
    "new_nkey",
    "operator_jwt",
    "user_jwt",
    "verified_claims",
]

Kind = Literal["operator", "account", "user"]
_PREFIX = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}
HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
# NATS limits: -1 is "no limit".
NO_LIMIT = -1


@dataclass(frozen=True)
class NKey:
    """One nkey: its seed (secret, ``S...``) and public key (``O...``, ``A...``, ``U...``)."""

    seed: str
    public: str

    @classmethod
    def from_seed(cls, seed: str) -> NKey:
        """The key of ``seed`` (``S...``)."""
        pair = nkeys.from_seed(bytearray(seed.encode()))
        return cls(seed, pair.public_key.decode())

    def sign(self, data: bytes) -> bytes:
        """The ed25519 signature of ``data`` by this key."""
        return bytes(nkeys.from_seed(bytearray(self.seed.encode())).sign(data))

    def __repr__(self) -> str:  # never print the seed
        return f"NKey(public={self.public!r})"


def new_nkey(kind: Kind) -> NKey:
    """A new random nkey of ``kind``."""
    seed = nkeys.encode_seed(os.urandom(32), _PREFIX[kind])
    return NKey.from_seed(seed.decode())


def _unpadded_b64url(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def jwt_id(claims: dict[str, Any]) -> str:
    """The ``jti`` of ``claims``: unpadded base32 of the SHA-512/256 of their JSON
    without ``jti``."""
    without = {k: v for k, v in claims.items() if k != "jti"}
    digest = hashlib.new("sha512_256", _json(without)).digest()
    return base64.b32encode(digest).rstrip(b"=").decode()


def encode_jwt(claims: dict[str, Any], issuer: NKey, issued_at: int | None = None) -> str:
    """``claims`` (with ``sub``, ``name``, ``nats``...) as a JWT issued now (or at
    ``issued_at``) and signed by ``issuer``, which sets ``iss``, ``iat`` and ``jti``."""
    body = {k: v for k, v in claims.items() if k != "jti"}
    body["iat"] = int(time.time()) if issued_at is None else issued_at
    body["iss"] = issuer.public
    body = {"jti": jwt_id(body), **body}
    signed = f"{_b64url(_json(HEADER))}.{_b64url(_json(body))}"
    return f"{signed}.{_b64url(issuer.sign(signed.encode()))}"


def _claims(subject: str, name: str, nats: dict[str, Any], expires: int | None) -> dict[str, Any]:
    claims: dict[str, Any] = {"name": name, "sub": subject}
    if expires is not None:
        claims["exp"] = expires
    claims["nats"] = nats
    return claims


def operator_jwt(
    operator: NKey, name: str, system_account: str | None = None, signing_keys: tuple[str, ...] = ()
) -> str:
    """The operator's own JWT (self-signed) naming its system account's public key."""
    nats: dict[str, Any] = {}
    if signing_keys:
        nats["signing_keys"] = list(signing_keys)
    if system_account is not None:
        nats["system_account"] = system_account
    nats |= {"type": "operator", "version": 2}
    return encode_jwt(_claims(operator.public, name, nats, None), operator)


def account_jwt(
    account: str,
    name: str,
    operator: NKey,
    signing_keys: tuple[str, ...] = (),
    jetstream: bool = True,
) -> str:
    """The JWT of account ``account`` (public key), signed by ``operator``: no limits,
    JetStream unlimited when ``jetstream`` (a system account has none), users signed by
    ``signing_keys`` accepted too; users get no permission by default."""
    limits: dict[str, Any] = {
        "subs": NO_LIMIT,
        "data": NO_LIMIT,
        "payload": NO_LIMIT,
        "imports": NO_LIMIT,
        "exports": NO_LIMIT,
        "wildcards": True,
        "conn": NO_LIMIT,
        "leaf": NO_LIMIT,
    }
    if jetstream:
        limits |= {
            "mem_storage": NO_LIMIT,
            "disk_storage": NO_LIMIT,
            "streams": NO_LIMIT,
            "consumer": NO_LIMIT,
        }
    nats: dict[str, Any] = {"limits": limits}
    if signing_keys:
        nats["signing_keys"] = list(signing_keys)
    nats |= {"default_permissions": {"pub": {}, "sub": {}}, "type": "account", "version": 2}
    return encode_jwt(_claims(account, name, nats, None), operator)


def user_jwt(
    user: str,
    name: str,
    permissions: Permissions,
    issuer: NKey,
    issuer_account: str | None = None,
    expires: int | None = None,
    tags: tuple[str, ...] = (),
) -> str:
    """The JWT of user ``user`` (public key) named ``name`` (its resurge user name: its
    inbox prefix is ``_INBOX_<name>``) with ``permissions``, signed by ``issuer``: the
    account's key, or one of its signing keys with ``issuer_account`` the account's
    public key; valid until ``expires`` (Unix seconds) if given; ``tags`` are free
    strings the server ignores (nats-io/jwt lowercases tags: give them lowercase)."""
    nats: dict[str, Any] = {
        "pub": {"allow": list(permissions.publish)},
        "sub": {"allow": list(permissions.subscribe)},
        "subs": NO_LIMIT,
        "data": NO_LIMIT,
        "payload": NO_LIMIT,
    }
    if permissions.responses:  # one answer per request received, the server's default time
        nats["resp"] = {"max": 1, "ttl": 0}
    if issuer_account is not None:
        nats["issuer_account"] = issuer_account
    if tags:
        nats["tags"] = list(tags)
    nats |= {"type": "user", "version": 2}
    return encode_jwt(_claims(user, name, nats, expires), issuer)


def verified_claims(jwt: str, issuer: str) -> dict[str, Any]:
    """The claims of ``jwt`` if public key ``issuer`` signed it and names itself its
    ``iss``; ValueError if not (expiry is not checked: ``exp`` is in the claims)."""
    try:
        header, body, signature = jwt.strip().split(".")
        raw = base64.b32decode(issuer + "=" * (-len(issuer) % 8))
        if len(raw) != 35 or raw[0] not in _PREFIX.values():
            raise ValueError("not a public nkey of an operator, account or user")
        key = nacl.signing.VerifyKey(raw[1:33])
        key.verify(f"{header}.{body}".encode(), _unpadded_b64url(signature))
    except (ValueError, binascii.Error, nacl.exceptions.BadSignatureError) as error:
        raise ValueError(f"not a JWT signed by {issuer}: {error}") from None
    claims = jwt_claims(jwt)
    if claims.get("iss") != issuer:
        raise ValueError(f"not a JWT signed by {issuer}: its issuer is {claims.get('iss')!r}")
    return claims


def creds(jwt: str, seed: str) -> str:
    """The decorated ``.creds`` text of a user (its JWT and nkey seed) nats.py and the
    ``nats`` CLI read."""
    return (
        f"{USER_JWT_BEGIN}\n{jwt}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )
