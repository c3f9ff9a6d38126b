"""Who may say what, against a real nats-server with the users `resurge up` makes.

The server runs with the authorization config :class:`LocalAccess` writes for two
nodes. Each test connects as one role and checks what that role needs works and what
it must not do is denied: the server answers a forbidden publish or subscription with a
permissions violation (and does not deliver the message), which the client sees as an
error.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client

from resurge.contract.subscriptions import DETECTOR_FAULTS, DETECTOR_RAW, Scope
from resurge.control.views.history import read_history
from resurge.events import (
    Assign,
    Event,
    FaultDetected,
    JobDeleted,
    LogLine,
    NodeReport,
    ProcessExited,
    ReplicaSlot,
)
from resurge.local.access import LocalAccess
from resurge.local.nats_server import NatsServer
from resurge.runtime.bus import Bus
from resurge.runtime.command_inbox import CommandInbox, position_key
from resurge.runtime.nats_auth import CredentialsError, connect_options, read_credentials
from resurge.runtime.settings import Settings

NAMESPACE = "tauth"
NODES = ["node-0", "node-1"]
# The job whose launch agents on node-0 have a user of their own.
LAUNCHED = "team-a"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalAccess]]:
    state_dir = tmp_path_factory.mktemp("auth")
    access = LocalAccess(state_dir, Settings(namespace=NAMESPACE).subjects)
    access.prepare(NODES)
    access.add_job_agent("node-0", LAUNCHED)
    config = access.write_config(NODES)
    access.job_agent_ready("node-0", LAUNCHED)
    with NatsServer(state_dir / "nats", config=config) as server:
        yield server.url, access


def _settings(cluster: tuple[str, LocalAccess], role: str, node: str | None = None) -> Settings:
    url, access = cluster
    return Settings(
        nats_url=url,
        namespace=NAMESPACE,
        nats_credentials=access.path(role, node),
        connect_timeout_seconds=5,
    )


@contextlib.asynccontextmanager
async def _bus(
    cluster: tuple[str, LocalAccess], role: str, node: str | None = None
) -> AsyncIterator[Bus]:
    bus = await Bus.connect(_settings(cluster, role, node), role)
    try:
        yield bus
    finally:
        await bus.close()


class _Client:
    """A plain connection as one role that records the server's permission errors."""

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

    async def denied(self, what: str, subject: str) -> bool:
        """Whether the server answered with a violation of ``what`` on ``subject``."""
        needle = f'permissions violation for {what} to "{subject.lower()}"'
        for _ in range(100):
            await self.nc.flush()
            if any(needle in error for error in self.errors):
                return True
            await asyncio.sleep(0.02)  # the server's -ERR follows the flush's PONG: polled
        return False

    async def publish_denied(self, subject: str) -> bool:
        await self.nc.publish(subject, b"{}")
        return await self.denied("publish", subject)

    async def subscribe_denied(self, subject: str) -> bool:
        await self.nc.subscribe(subject)
        return await self.denied("subscription", subject)


@contextlib.asynccontextmanager
async def _client(
    cluster: tuple[str, LocalAccess], role: str, node: str | None = None
) -> AsyncIterator[_Client]:
    client = await _Client().open(_settings(cluster, role, node))
    try:
        yield client
    finally:
        await client.nc.close()


@pytest.fixture
async def streams(cluster: tuple[str, LocalAccess]) -> None:
    """The streams and buckets, as the supervisor (admin) creates them before anyone."""
    from resurge.cluster.local.backend import LocalBackend

    async with _bus(cluster, "admin") as bus:
        await bus.ensure_streams()
        await LocalBackend.open(bus)


def _job() -> str:
    return f"job-{uuid.uuid4().hex[:6]}"


# --- who gets on at all ---------------------------------------------------------------


async def test_anonymous_and_wrong_password_are_refused(
    cluster: tuple[str, LocalAccess],
) -> None:
    url, _ = cluster
    with pytest.raises(ConnectionError, match="refused the connection: it needs a user") as no:
        await Bus.connect(Settings(nats_url=url, connect_timeout_seconds=5), "anonymous")
    assert "RESURGE_NATS_USER and RESURGE_NATS_PASSWORD" in str(no.value)  # the variables
    wrong = Settings(nats_url=url, nats_user="viewer", nats_password="not-it")
    with pytest.raises(ConnectionError, match="user 'viewer' and its password were not"):
        await Bus.connect(wrong.model_copy(update={"connect_timeout_seconds": 5}), "guess")
    with pytest.raises(nats.errors.Error):
        await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0)


def test_credentials_are_private(cluster: tuple[str, LocalAccess], tmp_path: Path) -> None:
    _, access = cluster
    for folder in (access.state_dir, access.folder, access.config_path.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    files = [*access.folder.iterdir(), access.config_path]
    assert {p.name for p in access.folder.iterdir()} == {
        "admin.json",
        "detector.json",
        "restarter.json",
        "scaler.json",
        "viewer.json",
        "agent-node-0.json",
        "agent-node-1.json",
        "job-agents.json",
        access.job_agent_path("node-0", LAUNCHED).name,
    }
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # A copy others may read is not used.
    leaked = tmp_path / "viewer.json"
    leaked.write_text(access.path("viewer").read_text())
    leaked.chmod(0o644)
    with pytest.raises(CredentialsError, match="open to others"):
        read_credentials(leaked)


# --- agents -----------------------------------------------------------------------------


async def test_agent_publishes_its_own_raw_subjects_only(
    cluster: tuple[str, LocalAccess], streams: None
) -> None:
    async with _bus(cluster, "agent", "node-0") as bus:
        s = bus.subjects
        report = NodeReport(
            source=bus.source, node="node-0", slots_total=2, slots_free=2, healthy=True
        )
        await bus.publish(s.raw("_", "node_report", "node-0"), report)  # stored: acked
    async with _client(cluster, "agent", "node-0") as agent:
        assert await agent.publish_denied(s.raw("_", "node_report", "node-1"))
        assert await agent.publish_denied(s.raw("j", "progress", "node-1"))
        assert await agent.publish_denied(s.cmd("j", 0))  # no commands
        assert await agent.publish_denied(s.node_cmd("node-1"))
        assert await agent.publish_denied(s.fault("j", "process"))
        assert await agent.publish_denied(s.job("j"))
        assert await agent.publish_denied(s.capacity("node-0"))
        assert await agent.publish_denied(f"$KV.{s.kv_bucket('jobs')}.j")  # no job records
        assert await agent.publish_denied(f"$KV.{s.kv_bucket('nodes')}.node-1")  # nor others'


async def test_agent_reads_commands_but_no_other_stream_nor_others_inboxes(
    cluster: tuple[str, LocalAccess], streams: None
) -> None:
    async with _client(cluster, "agent", "node-0") as agent:
        s = Settings(namespace=NAMESPACE).subjects
        assert await agent.subscribe_denied(s.all("raw"))  # core: nothing but commands
        assert await agent.subscribe_denied(s.fault("j", "process"))
        assert await agent.subscribe_denied("_INBOX.>")  # nobody else's replies
        assert await agent.subscribe_denied("_INBOX_restarter.>")
        assert await agent.subscribe_denied("_INBOX_agent-node-1.>")
        # A consumer on another stream: the create request itself is refused.
        create = f"$JS.API.CONSUMER.CREATE.{s.stream('fault')}.spy.{s.all('fault')}"
        assert await agent.publish_denied(create)
        # Nor on the command stream, but for its node's own node-level commands.
        create = f"$JS.API.CONSUMER.CREATE.{s.stream('cmd')}.spy.{s.cmd('j', 0)}"
        assert await agent.publish_denied(create)
        # Direct gets of the command stream only; positions of its own node only.
        assert await agent.publish_denied(f"$JS.API.DIRECT.GET.{s.stream('fault')}")
        raw = s.raw("j", "progress", "node-0")
        assert await agent.publish_denied(f"$JS.API.DIRECT.GET.{s.stream('raw')}.{raw}")
        assert await agent.publish_denied(f"$KV.{s.kv_bucket('agent_positions')}.node-1.j.0.0")
        assert await agent.publish_denied(f"$JS.API.STREAM.DELETE.{s.stream('cmd')}")
        assert await agent.publish_denied(f"$JS.API.STREAM.CREATE.{s.stream('cmd')}")

    job = _job()
    got: list[Assign] = []
    came = asyncio.Event()

    async def on_command(command: Assign) -> None:
        got.append(command)
        came.set()

    async with _bus(cluster, "agent", "node-0") as agent_bus:
        inbox = CommandInbox(
            agent_bus,
            agent_bus.subjects.cmd(job, 0),
            on_command,
            expects=(Assign,),
            position_key=position_key("node-0", job, 0, 0),
        )
        await inbox.start()
        async with _bus(cluster, "restarter") as restarter:
            assign = Assign(
                source=restarter.source,
                job=job,
                replica=0,
                generation=1,
                rank_table=[ReplicaSlot(replica=0, node="node-0", nproc=1, first_rank=0)],
                world_size=1,
                master_addr="127.0.0.1",
                master_port=29500,
            )
            await restarter.publish(restarter.subjects.cmd(job, 0), assign)
        await asyncio.wait_for(came.wait(), 10)
        await inbox.close()
    assert got[0].generation == 1


async def test_a_launch_agent_says_only_its_jobs_raw_events_on_its_node_and_reads_its_commands(
    cluster: tuple[str, LocalAccess], streams: None
) -> None:
    """A worker that steals its launch agent's credentials can lie about its own job on
    its own node, and nothing else: not another job (on the same node), not the node
    (an XID), not another node."""
    url, access = cluster
    settings = Settings(
        nats_url=url,
        namespace=NAMESPACE,
        nats_credentials=access.job_agent_path("node-0", LAUNCHED),
        connect_timeout_seconds=5,
    )
    async with contextlib.AsyncExitStack() as stack:
        bus = await Bus.connect(settings, "node-agent")
        stack.push_async_callback(bus.close)
        s = bus.subjects
        line = LogLine(
            source=bus.source, job=LAUNCHED, replica=0, node="node-0", rank=0,
            local_rank=0, stream="stdout", line="step 1",
        )  # fmt: skip
        await bus.publish(s.raw(LAUNCHED, "log_line", "node-0"), line)  # stored: acked
        client = await _Client().open(settings)
        stack.push_async_callback(client.nc.close)
        assert await client.publish_denied(s.raw("team-b", "process_exited", "node-0"))
        assert await client.publish_denied(s.raw(LAUNCHED, "progress", "node-1"))
        assert await client.publish_denied(s.raw("_", "gpu_error", "node-0"))
        assert await client.publish_denied(s.raw("_", "node_report", "node-0"))
        assert await client.publish_denied(s.raw(LAUNCHED, "gpu_error", "node-0"))
        assert await client.publish_denied(s.cmd(LAUNCHED, 0))
        assert await client.publish_denied(f"$KV.{s.kv_bucket('nodes')}.node-0")
        assert await client.subscribe_denied(s.cmd("team-b", 0))
        positions = s.kv_bucket("agent_positions")
        assert await client.publish_denied(f"$KV.{positions}.node-0.team-b.0.0")
        got: asyncio.Queue[Assign] = asyncio.Queue()

        async def on_command(command: Assign) -> None:
            await got.put(command)

        inbox = CommandInbox(
            bus, s.cmd(LAUNCHED, 0), on_command, expects=(Assign,),
            position_key=position_key("node-0", LAUNCHED, 0, 0),
        )  # fmt: skip
        await inbox.start()
        stack.push_async_callback(inbox.close)
        async with _bus(cluster, "restarter") as restarter:
            assign = Assign(
                source=restarter.source, job=LAUNCHED, replica=0, generation=1,
                rank_table=[ReplicaSlot(replica=0, node="node-0", nproc=1, first_rank=0)],
                world_size=1, master_addr="127.0.0.1", master_port=29500,
            )  # fmt: skip
            await restarter.publish(restarter.subjects.cmd(LAUNCHED, 0), assign)
        assert (await asyncio.wait_for(got.get(), 10)).generation == 1


async def test_agent_writes_only_its_own_node_record(
    cluster: tuple[str, LocalAccess], streams: None
) -> None:
    async with _bus(cluster, "agent", "node-0") as bus:
        nodes = await bus.js.key_value(bus.subjects.kv_bucket("nodes"))
        await nodes.put("node-0", b"{}")  # acked by the bucket's stream
        assert (await nodes.get("node-0")).value == b"{}"


# --- the services -------------------------------------------------------------------------


async def test_detector_says_faults_but_no_commands(
    cluster: tuple[str, LocalAccess], streams: None
) -> None:
    job = _job()
    async with _bus(cluster, "detector") as bus:
        fault = FaultDetected(
            source=bus.source, job=job, fault_id=f"{job}-f", scope="process", reason="crash"
        )
        await bus.publish(bus.subjects.fault(job, "process"), fault)

        async def ignore(events: list[Event]) -> None:
            del events

        # Its fault-grade reader: a consumer of the fault-grade stream, here reading an
        # agent's exit (stored there, not in the telemetry stream).
        got: asyncio.Queue[Event] = asyncio.Queue()

        async def take(events: list[Event]) -> None:
            for event in events:
                got.put_nowait(event)

        await bus.bind(DETECTOR_FAULTS, take, Scope(group="detector"))
        await bus.bind(DETECTOR_RAW, ignore, Scope(group="detector"))
        async with _bus(cluster, "agent", "node-1") as agent:
            exited = ProcessExited(
                source=agent.source, job=job, node="node-1", pid=7, local_rank=0,
                local_world_size=1, exit_code=1,
            )  # fmt: skip
            await agent.publish(agent.subjects.raw(job, "process_exited", "node-1"), exited)
        assert (await asyncio.wait_for(got.get(), 10)).id == exited.id
    async with _client(cluster, "detector") as detector:
        s = Settings(namespace=NAMESPACE).subjects
        assert await detector.subscribe_denied(s.raw(None, "progress", None))  # live: no
        assert await detector.subscribe_denied(s.raw(None, "process_exited", None))
        assert await detector.publish_denied(s.cmd(job, 0))
        assert await detector.publish_denied(s.node_cmd("node-0"))
        assert await detector.publish_denied(s.raw(job, "progress", "node-0"))
        assert await detector.publish_denied(s.action(job))
        assert await detector.publish_denied(f"$KV.{s.kv_bucket('workergroups')}.x.y.0")


@pytest.mark.parametrize("role", ["restarter", "scaler"])
async def test_restarter_and_scaler_publish_commands(
    cluster: tuple[str, LocalAccess], streams: None, role: str
) -> None:
    job = _job()
    async with _bus(cluster, role) as bus:
        stop_all = JobDeleted(source=bus.source, job=job)  # any event: the subject matters
        await bus.js.publish(bus.subjects.cmd(job, 0), stop_all.model_dump_json().encode())
    async with _client(cluster, role) as service:
        s = Settings(namespace=NAMESPACE).subjects
        assert await service.subscribe_denied(s.raw(None, "process_exited", None))
        assert await service.publish_denied(s.raw(job, "progress", "node-0"))
        assert await service.publish_denied(s.fault(job, "process"))


# --- people -------------------------------------------------------------------------------


async def test_viewer_only_reads(cluster: tuple[str, LocalAccess], streams: None) -> None:
    job = _job()
    seen = asyncio.Event()
    async with _bus(cluster, "viewer") as viewer:
        await viewer.ensure_streams(update=False)  # what `resurge status` does: reads only
        jobs = await viewer.jobs_bucket()
        assert await jobs.status()

        async def on_event(event: object, subject: str) -> None:
            seen.set()

        await viewer.subscribe(f"{viewer.subjects.root}.>", on_event)
        await viewer.nc.flush()
        async with _bus(cluster, "admin") as admin:
            await admin.publish(admin.subjects.job(job), JobDeleted(source=admin.source, job=job))
        await asyncio.wait_for(seen.wait(), 10)
        history = await read_history(viewer, job=job)  # what `resurge events` does
        assert [stored.event.kind for stored in history.events] == ["job_deleted"]
    async with _client(cluster, "viewer") as viewer_client:
        s = Settings(namespace=NAMESPACE).subjects
        for subject in (
            s.job(job),
            s.cmd(job, 0),
            s.raw(job, "progress", "node-0"),
            s.capacity("node-0"),
            f"$KV.{s.kv_bucket('jobs')}.{job}",
            f"$KV.{s.kv_bucket('cordons')}.node-0",
            f"$JS.API.STREAM.CREATE.{s.stream('job')}",
            f"$JS.API.STREAM.PURGE.{s.stream('job')}",
        ):
            assert await viewer_client.publish_denied(subject), subject


async def test_admin_submits_but_says_nothing_for_a_node(
    cluster: tuple[str, LocalAccess], streams: None
) -> None:
    async with _client(cluster, "admin") as admin:
        s = Settings(namespace=NAMESPACE).subjects
        assert await admin.publish_denied(s.raw("j", "process_exited", "node-0"))
        assert await admin.publish_denied(s.fault("j", "process"))
        assert await admin.publish_denied(f"$JS.API.STREAM.DELETE.{s.stream('raw')}")


# --- TLS ----------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate it signed for 127.0.0.1."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "1", "-subj", "/CN=resurge test CA", cwd=folder)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=127.0.0.1", cwd=folder)  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.ext",
             cwd=folder)  # fmt: skip
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


async def test_tls_with_a_generated_ca(tmp_path: Path) -> None:
    from resurge.access.server_config import tls_block

    ca, cert, key = _certificates(tmp_path)
    access = LocalAccess(tmp_path / "state", Settings(namespace=NAMESPACE).subjects)
    access.prepare(["node-0"])
    config = access.write_config(["node-0"], tls_block(cert, key, None))
    with NatsServer(tmp_path / "nats", config=config, scheme="tls") as server:
        assert server.url.startswith("tls://")
        settings = Settings(
            nats_url=server.url,
            namespace=NAMESPACE,
            nats_credentials=access.path("admin"),
            nats_tls_ca=ca,
            connect_timeout_seconds=5,
        )
        bus = await Bus.connect(settings, "admin")
        try:
            await bus.ensure_streams()
            assert bus.nc.is_connected
        finally:
            await bus.close()
        # Without the CA the server's certificate is not trusted.
        untrusting = settings.model_copy(update={"nats_tls_ca": None, "connect_timeout_seconds": 2})
        with pytest.raises(ConnectionError):
            await Bus.connect(untrusting, "admin")
