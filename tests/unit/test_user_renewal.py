"""What an agent's JWT renewal changes in its credentials (resurge.runtime.user_renewal):
the JWT only, never the seed; the end to end is tests/kubernetes/test_e2e_pod_users.py."""

from __future__ import annotations

import pytest

from resurge.access.nats_jwt import creds
from resurge.runtime.nats_auth import CredentialsError
from resurge.runtime.user_renewal import current_jwt, with_jwt


def test_a_renewed_jwt_replaces_the_old_one_and_keeps_the_seed() -> None:
    text = creds("old.jwt.value", "SUAEXAMPLESEED")
    assert current_jwt(text) == "old.jwt.value"
    renewed = with_jwt(text, "new.jwt.value")
    assert current_jwt(renewed) == "new.jwt.value"
    assert "SUAEXAMPLESEED" in renewed and "old.jwt.value" not in renewed
    assert renewed.replace("new.jwt.value", "old.jwt.value") == text


def test_credentials_without_a_jwt_are_refused_a_renewal() -> None:
    assert current_jwt("user: someone") is None
    with pytest.raises(CredentialsError, match="no user JWT"):
        with_jwt("user: someone", "new.jwt.value")
