"""How long the CLI waits for a NATS server that does not answer: a person waits on the
command, so a few seconds, not a service's 30; RESURGE_CONNECT_TIMEOUT_SECONDS still
sets another limit."""

from __future__ import annotations

import pytest

from resurge.cli.connect import CLI_CONNECT_SECONDS, cluster_settings


def test_the_cli_gives_an_unreachable_server_a_few_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RESURGE_NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.delenv("RESURGE_CONNECT_TIMEOUT_SECONDS", raising=False)
    settings, local = cluster_settings(None)
    assert not local and settings.connect_timeout_seconds == CLI_CONNECT_SECONDS <= 5


def test_the_setting_still_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESURGE_NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("RESURGE_CONNECT_TIMEOUT_SECONDS", "12")
    settings, _ = cluster_settings(None)
    assert settings.connect_timeout_seconds == 12
