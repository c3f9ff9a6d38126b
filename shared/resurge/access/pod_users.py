"""Kubernetes pods' own NATS users: made and checked with the account's signing key.

:class:`PodIssuer` is the scaler's :class:`~resurge.cluster.kubernetes.pod_credentials.PodUsers`
(that module says what the controller does with them). A pod's user is a new user
nkey and a JWT signed by a signing key of resurge's account (``kube_nats_signer``,
``kube_nats_account``), with the permissions of a launch agent of the pod's job on the
pod's node (:func:`~resurge.access.permissions.role_permissions` with ``node`` and
``job``), named :func:`~resurge.access.permissions.job_agent_user` (its inbox prefix),
tagged ``resurge-pod:<namespace>/<pod>`` and valid ``kube_nats_credentials_seconds``.
:meth:`PodIssuer.pod_of` reads that tag back from a JWT whose signature it verifies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from resurge.access.nats_jwt import NKey, creds, new_nkey, user_jwt, verified_claims
from resurge.access.permissions import job_agent_user, role_permissions
from resurge.cluster.kubernetes.pod_credentials import Issued

if TYPE_CHECKING:
    from resurge.cluster.protocol import WorkerGroupSpec
    from resurge.contract.subjects import Subjects
    from resurge.runtime.settings import Settings

__all__ = ["POD_TAG", "PodIssuer"]

POD_TAG = "resurge-pod:"


@dataclass(frozen=True)
class PodIssuer:
    """Issues pods' users with ``signer``, a signing key of account ``account``."""

    account: str
    signer: NKey
    subjects: Subjects
    seconds: int

    @classmethod
    def from_settings(cls, settings: Settings) -> PodIssuer | None:
        """The issuer ``settings`` configure; None without a signing key; ValueError
        naming the setting that is wrong."""
        if settings.kube_nats_signer is None:
            return None
        if not settings.kube_nats_account:
            raise ValueError("RESURGE_KUBE_NATS_SIGNER is set without RESURGE_KUBE_NATS_ACCOUNT")
        seed = settings.kube_nats_signer.get_secret_value().strip()
        if not seed.startswith("SA"):
            raise ValueError("RESURGE_KUBE_NATS_SIGNER is not an account signing key seed (SA...)")
        try:
            signer = NKey.from_seed(seed)
        except Exception as error:  # nkeys' errors share no base
            raise ValueError(f"RESURGE_KUBE_NATS_SIGNER is unreadable: {error!r}") from None
        return cls(
            settings.kube_nats_account,
            signer,
            settings.subjects,
            settings.kube_nats_credentials_seconds,
        )

    def issue(
        self, spec: WorkerGroupSpec, namespace: str, pod: str, seed: str | None = None
    ) -> Issued:
        """A user for pod ``namespace/pod`` of worker group ``spec``: a new key, or the
        one of ``seed`` (a renewal), with a JWT valid from now."""
        key = NKey.from_seed(seed) if seed else new_nkey("user")
        expires = int(time.time()) + self.seconds
        jwt = user_jwt(
            key.public,
            job_agent_user(spec.node, spec.job),
            role_permissions("agent", self.subjects, node=spec.node, job=spec.job),
            self.signer,
            issuer_account=self.account,
            expires=expires,
            tags=(f"{POD_TAG}{namespace}/{pod}",),
        )
        return Issued(jwt, key.seed, key.public, expires, creds(jwt, key.seed))

    def pod_of(self, jwt: str) -> tuple[str, str, str]:
        """(namespace, pod, user public key) of a JWT this issuer signed; ValueError if
        it did not sign it or it names no pod."""
        claims = verified_claims(jwt, self.signer.public)
        for tag in (claims.get("nats") or {}).get("tags") or []:
            if isinstance(tag, str) and tag.startswith(POD_TAG):
                namespace, _, pod = tag[len(POD_TAG) :].partition("/")
                if namespace and pod:
                    return namespace, pod, str(claims.get("sub"))
        raise ValueError("the JWT names no pod")
