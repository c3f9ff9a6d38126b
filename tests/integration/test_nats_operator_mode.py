"""resurge's parties on a real nats-server in operator mode (users are JWTs).

The server trusts an operator whose account for resurge has JetStream; every user JWT
is signed by that account's signing key (:class:`resurge.access.server_config.
NatsIdentities`), its permissions those of its role
(:func:`resurge.access.permissions.role_permissions`). The server is the judge of the
JWTs (:mod:`resurge.access.nats_jwt`): it refuses a connection whose JWT it cannot
verify, and a publish its permissions do not allow.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from resurge.access.nats_jwt import new_nkey
from resurge.access.server_config import NatsIdentities, UserIssuer, nats_identities
from resurge.contract.subjects import Subjects
from resurge.events import NodeReport, ProcessExited
from resurge.local.nats_server import NatsServer
from resurge.runtime.bus import Bus
from resurge.runtime.nats_auth import connect_options
from resurge.runtime.settings import Settings

NAMESPACE = "tjwt"
SUBJECTS = Settings(namespace=NAMESPACE).subjects


@pytest.fixture(scope="module")
def operator_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, NatsIdentities]]:
    """A nats-server with JetStream trusting a new install's operator."""
    state_dir = tmp_path_factory.mktemp("operator")
    identities = nats_identities(SUBJECTS)
    config = state_dir / "nats.conf"
    config.write_text(identities.server_config())
    with NatsServer(state_dir / "nats", config=config) as server:
        yield server.url, identities


def _creds_file(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.creds"
    path.write_text(text)
    path.chmod(0o600)
    return path


def _settings(url: str, creds: str | None = None, file: Path | None = None) -> Settings:
    """Settings of a party with user credentials: their text, or a .creds file."""
    return Settings(
        nats_url=url,
        namespace=NAMESPACE,
        connect_timeout_seconds=5,
        nats_creds=creds,
        nats_credentials=file,
    )


@contextlib.asynccontextmanager
async def _bus(settings: Settings, service: str) -> AsyncIterator[Bus]:
    bus = await Bus.connect(settings, service)
    try:
        yield bus
    finally:
        await bus.close()


class _Client:
    """A plain connection that records the server's permission errors."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc = Client()

    async def open(self, settings: Settings) -> _Client:
        async def on_error(error: Exception) -> None:
            self.errors.append(str(error).lower())

        await self.nc.connect(
            settings.nats_url, error_cb=on_error, allow_reconnect=False, **connect_options(settings)
        )
        return self

    async def publish_denied(self, subject: str) -> bool:
        """Whether the server answered a publish to ``subject`` with a violation."""
        await self.nc.publish(subject, b"{}")
        needle = f'permissions violation for publish to "{subject.lower()}"'
        for _ in range(100):
            await self.nc.flush()
            if any(needle in error for error in self.errors):
                return True
            await asyncio.sleep(0.02)  # the server's -ERR follows the flush's PONG: polled
        return False


async def test_services_make_streams_and_events_flow(
    operator_server: tuple[str, NatsIdentities], tmp_path: Path
) -> None:
    """The scaler (from a .creds file) makes the streams as the Bus does; an agent's
    event (from RESURGE_NATS_CREDS, the text) is stored and the detector reads it."""
    url, identities = operator_server
    scaler = _settings(url, file=_creds_file(tmp_path, "scaler", identities.role_creds["scaler"]))
    detector = _settings(
        url, file=_creds_file(tmp_path, "detector", identities.role_creds["detector"])
    )
    agent = _settings(url, creds=identities.role_creds["agent"])
    async with _bus(scaler, "scaler") as bus:
        await bus.ensure_streams()
    async with _bus(detector, "detector") as bus:
        await bus.ensure_streams()
    async with _bus(agent, "node-monitor") as bus:
        report = NodeReport(source=bus.source, node="n1", slots_total=2, slots_free=2, healthy=True)
        await bus.publish(SUBJECTS.raw("_", "node_report", "n1"), report)  # acked: stored
    async with _bus(detector, "detector") as bus:
        stream = bus.subjects.stream("raw")
        info = await bus.js.stream_info(stream)
        assert info.state.messages >= 1


async def test_a_job_agent_publishes_its_own_job_on_its_own_node_only(
    operator_server: tuple[str, NatsIdentities],
) -> None:
    url, identities = operator_server
    async with _bus(_settings(url, creds=identities.role_creds["scaler"]), "scaler") as bus:
        await bus.ensure_streams()
    creds = identities.issuer.creds("agent", SUBJECTS, node="n1", job="j1")
    settings = _settings(url, creds=creds)
    async with _bus(settings, "node-agent") as bus:
        exited = ProcessExited(
            source=bus.source, job="j1", node="n1", pid=7, local_rank=0, local_world_size=1,
            exit_code=1,
        )  # fmt: skip
        await bus.publish(SUBJECTS.raw("j1", "process_exited", "n1"), exited)
    client = await _Client().open(settings)
    try:
        assert not await client.publish_denied(SUBJECTS.raw("j1", "process_exited", "n1"))
        assert await client.publish_denied(SUBJECTS.raw("j2", "process_exited", "n1"))
        assert await client.publish_denied(SUBJECTS.raw("j1", "process_exited", "n2"))
        assert await client.publish_denied(SUBJECTS.raw("_", "gpu_error", "n1"))
    finally:
        await client.nc.close()


async def test_an_expired_user_is_refused_at_connect(
    operator_server: tuple[str, NatsIdentities],
) -> None:
    url, identities = operator_server
    expired = identities.issuer.creds("viewer", SUBJECTS, expires=int(time.time()) - 60)
    with pytest.raises(ConnectionError, match="refused the connection: its user JWT"):
        await Bus.connect(_settings(url, creds=expired), "viewer")
    valid = identities.issuer.creds("viewer", SUBJECTS, expires=int(time.time()) + 600)
    async with _bus(_settings(url, creds=valid), "viewer") as bus:
        assert bus.connected


async def test_a_user_of_another_operator_or_signer_is_refused(
    operator_server: tuple[str, NatsIdentities],
) -> None:
    url, identities = operator_server
    stranger = nats_identities(Subjects(NAMESPACE), roles=("viewer",))
    with pytest.raises(ConnectionError, match="refused the connection"):
        await Bus.connect(_settings(url, creds=stranger.role_creds["viewer"]), "viewer")
    # A key the account does not list as a signing key signs no user of it.
    unlisted = UserIssuer(new_nkey("account"), identities.account.public)
    with pytest.raises(ConnectionError, match="refused the connection"):
        await Bus.connect(_settings(url, creds=unlisted.creds("viewer", SUBJECTS)), "viewer")


async def test_the_creds_text_from_the_environment_connects(
    operator_server: tuple[str, NatsIdentities], monkeypatch: pytest.MonkeyPatch
) -> None:
    """How a Kubernetes Secret's key reaches a party: RESURGE_NATS_CREDS, multi-line."""
    url, identities = operator_server
    monkeypatch.setenv("RESURGE_NATS_URL", url)
    monkeypatch.setenv("RESURGE_NAMESPACE", NAMESPACE)
    monkeypatch.setenv("RESURGE_NATS_CREDS", identities.role_creds["viewer"])
    settings = Settings()
    assert "BEGIN NATS USER JWT" not in repr(settings)  # a secret
    async with _bus(settings, "viewer") as bus:
        assert bus.connected
        assert connect_options(settings)["inbox_prefix"] == "_INBOX_viewer"
