"""Each job pod's own NATS user, issued and kept fresh by the controller.

Where NATS runs in operator mode (docs/security.md, Credentials) and the scaler holds a
signing key of resurge's account (``kube_nats_account``, ``kube_nats_signer``), the
controller gives every pod it creates a NATS user of its own:

- a new user nkey, and a user JWT signed by that key whose permissions are those of a
  launch agent of the pod's job on the pod's node
  (:func:`resurge.access.permissions.role_permissions` with ``node`` and ``job``: its
  job's raw kinds on its node, its job's commands), named after that user
  (:func:`~resurge.access.permissions.job_agent_user`, its inbox prefix), tagged with the
  pod (``resurge-pod:<namespace>/<name>``), valid ``kube_nats_credentials_seconds``;
- both in a Secret of the job's namespace, ``<pod>-nats``, key ``creds`` (the ``.creds``
  text), owned by the TrainingJob, which the pod's agent container reads as
  ``RESURGE_NATS_CREDS``. An environment variable, not a mounted file: the agent is not
  dumpable and its workers start from a scrubbed environment, so a worker (not root)
  cannot read it, where it could read a file of its container.

A JWT cannot be changed once issued, so a pod's is renewed: the controller gives a
Secret a new JWT (same user key) once less than half its time is left (it sweeps its
pods' Secrets, so a container started again reads a valid one), and a running agent
asks for it on ``<ns>.v1.access.renew`` (:mod:`.renewal`) with the JWT it has.

This module holds what the controller does with users; :class:`PodUsers` is what makes
and checks them (signing, permissions), which lies in a layer above the cluster's
(:class:`resurge.access.pod_users.PodIssuer`) and is handed in by the scaler.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from resurge.cluster.kubernetes.objects import owner_reference
from resurge.runtime.nats_auth import USER_JWT_BEGIN, jwt_claims

if TYPE_CHECKING:
    from resurge.cluster.protocol import WorkerGroupSpec

__all__ = [
    "CREDS_ENV",
    "SECRET_KEY",
    "Issued",
    "PodUsers",
    "issued_of",
    "read_creds",
    "secret_manifest",
    "secret_name",
]

CREDS_ENV = "RESURGE_NATS_CREDS"
SECRET_KEY = "creds"
_SEED_BEGIN = "-----BEGIN USER NKEY SEED-----"


@dataclass(frozen=True)
class Issued:
    """A pod's user: its JWT, its seed (secret), its public key, the JWT's expiry and
    its ``.creds`` text."""

    jwt: str
    seed: str
    user: str
    expires: int
    creds: str

    def __repr__(self) -> str:  # never print the seed
        return f"Issued(user={self.user!r}, expires={self.expires})"


class PodUsers(Protocol):
    """Makes and checks pods' NATS users (module docstring)."""

    @property
    def seconds(self) -> int:
        """How long a JWT it issues is valid."""
        ...

    def issue(
        self, spec: WorkerGroupSpec, namespace: str, pod: str, seed: str | None = None
    ) -> Issued:
        """A user for pod ``namespace/pod`` of ``spec``: a new key, or ``seed``'s."""
        ...

    def pod_of(self, jwt: str) -> tuple[str, str, str]:
        """(namespace, pod, user public key) of a JWT this issuer signed; ValueError if
        it did not sign it or it names no pod."""
        ...


def secret_name(pod: str) -> str:
    """The Secret holding pod ``pod``'s NATS user."""
    return f"{pod}-nats"


def read_creds(text: str) -> tuple[str, str]:
    """The JWT and seed of a ``.creds`` text; ValueError if either is missing."""
    lines = [line.strip() for line in text.splitlines()]
    try:
        return lines[lines.index(USER_JWT_BEGIN) + 1], lines[lines.index(_SEED_BEGIN) + 1]
    except (ValueError, IndexError):
        raise ValueError("not a NATS user .creds text (no JWT or no seed)") from None


def issued(creds: str) -> Issued:
    """The user of ``.creds`` text ``creds``; ValueError if unreadable or without expiry."""
    jwt, seed = read_creds(creds)
    claims = jwt_claims(jwt)  # unverified: the controller reads its own Secret
    try:
        return Issued(jwt, seed, str(claims["sub"]), int(claims["exp"]), creds)
    except (KeyError, TypeError, ValueError):
        raise ValueError("the JWT names no user or no expiry") from None


def issued_of(secret: dict[str, Any]) -> Issued | None:
    """The user a pod's Secret holds, or None if it holds none readable."""
    data = (secret.get("data") or {}).get(SECRET_KEY)
    if not isinstance(data, str):
        return None
    try:
        return issued(base64.b64decode(data).decode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None


def stale(user: Issued, seconds: int, now: float) -> bool:
    """Whether less than half of ``user``'s time (``seconds`` in all) is left at ``now``."""
    return user.expires - now < seconds / 2


def secret_manifest(
    namespace: str, pod: str, user: Issued, training_job: dict[str, Any] | None
) -> dict[str, Any]:
    """The Secret of pod ``pod``'s user, owned by its TrainingJob."""
    metadata: dict[str, Any] = {"name": secret_name(pod), "namespace": namespace}
    if training_job is not None:
        metadata["ownerReferences"] = [owner_reference(training_job)]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {SECRET_KEY: base64.b64encode(user.creds.encode()).decode()},
    }
