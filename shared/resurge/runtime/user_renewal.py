"""Keep a connection's user JWT valid: ask for a new one before it expires.

A Kubernetes pod's agent connects with a user JWT of its own that expires
(:mod:`resurge.cluster.kubernetes.pod_credentials`), and a NATS server closes a
connection whose JWT expired. :func:`keep_user_fresh` waits until half the JWT's time
has passed, asks the controller for a new one on ``<ns>.v1.access.renew`` (request
``{"jwt": <the JWT>}``, answer ``{"jwt": <new>}`` or ``{"error": ...}``), puts it in the
connection's credentials (nats.py reads them again at each connect) and reconnects, so
the server holds the new expiry. A refusal or no answer is asked again after a tenth of
what is left (at least 5 s); at the expiry the server closes the connection, and the
agent exits to be started again with the Secret the controller keeps fresh.

A JWT without ``exp``, or credentials that are not a ``.creds`` text, are left alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import UserString
from typing import TYPE_CHECKING

from resurge.runtime.nats_auth import USER_JWT_BEGIN, CredentialsError, jwt_claims

if TYPE_CHECKING:
    from nats.aio.client import Client

    from resurge.contract.subjects import Subjects

__all__ = ["current_jwt", "keep_user_fresh", "with_jwt"]

log = logging.getLogger("resurge.runtime")

_ASK_SECONDS = 10.0
_RETRY_MIN_SECONDS = 5.0


def current_jwt(text: str) -> str | None:
    """The user JWT of a ``.creds`` text, or None."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if USER_JWT_BEGIN in line:
            return lines[i + 1].strip()
    return None


def with_jwt(text: str, jwt: str) -> str:
    """The ``.creds`` text with its user JWT replaced by ``jwt`` (the seed kept)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines[:-1]):
        if USER_JWT_BEGIN in line:
            lines[i + 1] = f"{jwt}\n"
            return "".join(lines)
    raise CredentialsError("the credentials hold no user JWT to replace")


def _times(jwt: str) -> tuple[float, float] | None:
    claims = jwt_claims(jwt)
    expires, issued = claims.get("exp"), claims.get("iat")
    if not isinstance(expires, int | float):
        return None
    return float(issued if isinstance(issued, int | float) else time.time()), float(expires)


async def _ask(nc: Client, subjects: Subjects, jwt: str) -> str:
    """A new JWT from the controller; CredentialsError saying why not."""
    try:
        reply = await nc.request(
            subjects.access_renew(), json.dumps({"jwt": jwt}).encode(), timeout=_ASK_SECONDS
        )
        answer = json.loads(reply.data)
    except (TimeoutError, ValueError) as error:
        raise CredentialsError(f"no answer to the renewal: {error!r}") from None
    except Exception as error:  # nats.py's NoRespondersError and kin
        raise CredentialsError(f"no answer to the renewal: {error!r}") from None
    new = answer.get("jwt") if isinstance(answer, dict) else None
    if not isinstance(new, str):
        raise CredentialsError(
            f"renewal refused: {answer.get('error') if isinstance(answer, dict) else answer}"
        )
    return new


async def keep_user_fresh(nc: Client, subjects: Subjects, credentials: UserString) -> None:
    """Renew ``credentials`` (the ``.creds`` text nats.py connects with) as the module
    docstring says, until cancelled or the JWT has no expiry."""
    while True:
        jwt = current_jwt(credentials.data)
        times = None if jwt is None else _times(jwt)
        if jwt is None or times is None:
            return
        issued, expires = times
        await asyncio.sleep(max(0.0, issued + (expires - issued) / 2 - time.time()))
        while True:
            try:
                new = await _ask(nc, subjects, jwt)
                break
            except CredentialsError as error:
                left = expires - time.time()
                log.warning("NATS user JWT (%.0f s left): %s", left, error)
                await asyncio.sleep(max(_RETRY_MIN_SECONDS, left / 10))
        credentials.data = with_jwt(credentials.data, new)
        log.info("NATS user JWT renewed; reconnecting with it")
        await nc.force_reconnect()
