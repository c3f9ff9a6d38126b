"""NATS JWTs and user credentials (resurge.access.nats_jwt, resurge.runtime.nats_auth).

What nats-server accepts is tests/integration/test_nats_operator_mode.py's; here the
encoding itself: NATS JWT v2 as github.com/nats-io/jwt (v2) writes it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path

import nkeys
import pytest
from nats.aio.client import RawCredentials

from resurge.access.nats_jwt import (
    account_jwt,
    creds,
    jwt_claims,
    new_nkey,
    operator_jwt,
    user_jwt,
    verified_claims,
)
from resurge.access.permissions import job_agent_user, role_permissions, role_user
from resurge.access.server_config import MAX_CONTROL_LINE, nats_identities
from resurge.runtime.nats_auth import (
    CredentialsError,
    connect_options,
    read_user_credentials,
    user_credentials_of,
)
from resurge.runtime.settings import Settings
from resurge_node_agent.private import worker_base_environment

S = Settings(namespace="tjwt").subjects


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_keys_have_the_prefix_of_their_kind() -> None:
    for kind, letter in (("operator", "O"), ("account", "A"), ("user", "U")):
        key = new_nkey(kind)  # type: ignore[arg-type]
        assert key.public.startswith(letter) and len(key.public) == 56
        assert key.seed.startswith(f"S{letter}")
        assert key.seed not in repr(key)


def test_a_user_jwt_decodes_to_its_claims_and_its_issuer_signed_it() -> None:
    signing_key, account, user = new_nkey("account"), new_nkey("account"), new_nkey("user")
    permissions = role_permissions("agent", S, node="n1", job="j1")
    expires = int(time.time()) + 60
    name = job_agent_user("n1", "j1")
    token = user_jwt(
        user.public, name, permissions, signing_key, issuer_account=account.public, expires=expires
    )
    header, payload, signature = token.split(".")
    assert "=" not in token
    assert json.loads(_b64(header)) == {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = jwt_claims(token)
    assert claims == json.loads(_b64(payload))
    assert claims["sub"] == user.public and claims["iss"] == signing_key.public
    assert claims["name"] == name and claims["exp"] == expires
    assert abs(claims["iat"] - time.time()) < 60
    nats = claims["nats"]
    assert nats["type"] == "user" and nats["version"] == 2
    assert nats["issuer_account"] == account.public
    assert nats["pub"] == {"allow": list(permissions.publish)}
    assert nats["sub"] == {"allow": list(permissions.subscribe)}
    assert (nats["subs"], nats["data"], nats["payload"]) == (-1, -1, -1)
    # The signature is the issuer's of "header.payload", and of nothing else.
    issuer = nkeys.from_seed(bytearray(signing_key.seed.encode()))
    assert issuer.verify(f"{header}.{payload}".encode(), _b64(signature))
    forged = base64.urlsafe_b64encode(json.dumps({**claims, "name": "admin"}).encode()).rstrip(b"=")
    with pytest.raises(nkeys.ErrInvalidSignature):
        issuer.verify(f"{header}.{forged.decode()}".encode(), _b64(signature))


def test_verified_claims_check_the_issuers_signature() -> None:
    account, user, other = new_nkey("account"), new_nkey("user"), new_nkey("account")
    token = user_jwt(
        user.public, "viewer", role_permissions("viewer", S), account, tags=("pod:ns/p-0",)
    )
    claims = verified_claims(token, account.public)
    assert claims["nats"]["tags"] == ["pod:ns/p-0"] and claims["sub"] == user.public
    with pytest.raises(ValueError, match="not a JWT signed by"):
        verified_claims(token, other.public)
    header, _, signature = token.split(".")
    forged = base64.urlsafe_b64encode(json.dumps({**claims, "name": "admin"}).encode()).rstrip(b"=")
    with pytest.raises(ValueError, match="not a JWT signed by"):
        verified_claims(f"{header}.{forged.decode()}.{signature}", account.public)
    with pytest.raises(ValueError, match="not a public nkey"):
        verified_claims(token, user.seed)


def test_the_jwt_id_is_the_base32_sha512_256_of_the_claims_without_it() -> None:
    operator = new_nkey("operator")
    claims = jwt_claims(operator_jwt(operator, "op", system_account=new_nkey("account").public))
    without = {k: v for k, v in claims.items() if k != "jti"}
    digest = hashlib.new("sha512_256", json.dumps(without, separators=(",", ":")).encode())
    assert claims["jti"] == base64.b32encode(digest.digest()).decode().rstrip("=")
    assert len(claims["jti"]) == 52


def test_operator_and_account_claims() -> None:
    operator, account, signing_key = new_nkey("operator"), new_nkey("account"), new_nkey("account")
    op = jwt_claims(operator_jwt(operator, "op", system_account=account.public))
    assert op["iss"] == op["sub"] == operator.public  # self-signed
    assert op["nats"] == {"system_account": account.public, "type": "operator", "version": 2}
    acc = jwt_claims(account_jwt(account.public, "resurge", operator, (signing_key.public,)))
    assert acc["iss"] == operator.public and acc["sub"] == account.public
    nats = acc["nats"]
    assert nats["signing_keys"] == [signing_key.public]
    assert nats["type"] == "account" and nats["version"] == 2
    limits = nats["limits"]
    assert limits["wildcards"] is True
    for limit in ("mem_storage", "disk_storage", "streams", "consumer", "subs", "conn"):
        assert limits[limit] == -1, limit  # unlimited, JetStream enabled
    assert nats["default_permissions"] == {"pub": {}, "sub": {}}
    system = jwt_claims(account_jwt(account.public, "SYS", operator, jetstream=False))
    assert "disk_storage" not in system["nats"]["limits"]


def test_an_install_has_a_user_per_role_named_as_resurge_names_it() -> None:
    identities = nats_identities(S)
    assert identities.signing_key.seed not in repr(identities)
    for role, text in identities.role_creds.items():
        credentials = user_credentials_of(text, role)
        assert credentials.user == role_user(role) == role
        claims = jwt_claims(text.splitlines()[1])
        assert claims["iss"] == identities.signing_key.public
        assert claims["nats"]["issuer_account"] == identities.account.public
        assert "exp" not in claims
    config = identities.server_config()
    assert f"operator: {json.dumps(identities.operator_jwt)}" in config
    assert f"system_account: {identities.system_account.public}" in config
    assert "resolver: MEMORY" in config and f"max_control_line: {MAX_CONTROL_LINE}" in config
    assert f"{identities.account.public}: {json.dumps(identities.account_jwt)}" in config
    assert f"{identities.system_account.public}: " in config


def test_creds_text_and_file_name_the_inbox(tmp_path: Path) -> None:
    user = new_nkey("user")
    token = user_jwt(user.public, "viewer", role_permissions("viewer", S), new_nkey("account"))
    text = creds(token, user.seed)
    lines = text.splitlines()
    assert lines[0] == "-----BEGIN NATS USER JWT-----" and lines[1] == token
    assert lines[lines.index("-----BEGIN USER NKEY SEED-----") + 1] == user.seed
    options = connect_options(Settings(nats_creds=text))
    assert options["inbox_prefix"] == "_INBOX_viewer"
    assert isinstance(options["user_credentials"], RawCredentials)
    assert str(options["user_credentials"]) == text
    path = tmp_path / "viewer.creds"
    path.write_text(text)
    path.chmod(0o600)
    options = connect_options(Settings(nats_credentials=path))
    assert options == {"user_credentials": str(path), "inbox_prefix": "_INBOX_viewer"}
    assert user.seed not in repr(read_user_credentials(path))
    path.chmod(0o644)
    with pytest.raises(CredentialsError, match="open to others"):
        connect_options(Settings(nats_credentials=path))


def test_bad_user_credentials_say_what_is_wrong() -> None:
    user = new_nkey("user")
    good = user_jwt(user.public, "viewer", role_permissions("viewer", S), new_nkey("account"))
    with pytest.raises(CredentialsError, match="holds no NATS user JWT"):
        user_credentials_of(f"-----BEGIN USER NKEY SEED-----\n{user.seed}\n", "here")
    with pytest.raises(CredentialsError, match="holds no user nkey seed"):
        user_credentials_of(f"-----BEGIN NATS USER JWT-----\n{good}\n", "here")
    with pytest.raises(CredentialsError, match="here: not a JWT"):
        user_credentials_of(creds("not-a-jwt", user.seed), "here")
    header, _, signature = good.split(".")
    with pytest.raises(CredentialsError, match="claims are unreadable"):
        user_credentials_of(creds(f"{header}.!!!!.{signature}", user.seed), "here")
    nameless = user_jwt(user.public, "", role_permissions("viewer", S), new_nkey("account"))
    with pytest.raises(CredentialsError, match="name '' is not a user name"):
        user_credentials_of(creds(nameless, user.seed), "here")
    with pytest.raises(CredentialsError, match="RESURGE_NATS_CREDS holds no NATS user JWT"):
        connect_options(Settings(nats_creds="{}"))


def test_workers_never_get_the_creds_variable() -> None:
    environ = {"RESURGE_NATS_CREDS": "-----BEGIN NATS USER JWT-----", "PATH": "/bin"}
    assert worker_base_environment(environ) == {"PATH": "/bin"}
