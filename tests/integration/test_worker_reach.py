"""A worker cannot reach its agent's NATS credentials: not in its own environment, not in
the fork server's, not through its agent's ``/proc/<pid>/environ``.

Reproduced on a local cluster before: the fork server started with the agent's whole
environment, so a forked worker's ``/proc/self/environ`` (the fork server's, inherited)
named the agent's credentials file, and the agent's own ``/proc/<pid>/environ`` was
readable by its workers (same user). The worker here is a plain script that never
imports resurge (tests/e2e/workers/credential_thief.py). Agent and worker run as one
user that is not root (a test run as root starts the agent as ``nobody``, with this
Python version's interpreter from outside root's home and the packages on
``PYTHONPATH``): root, or any holder of ``CAP_SYS_PTRACE``, may read any process.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.events import Assign, LogLine, ProcessExited, ReplicaSlot, Stop
from resurge.runtime.bus import Bus
from resurge.runtime.nats_auth import Credentials, write_credentials
from resurge.runtime.settings import Settings
from resurge_node_agent.launch.group_spec import spec_environment
from tests.collect import Events
from tests.integration.agent_process import free_port

JOB = "reach"
REPO = Path(__file__).resolve().parents[2]
THIEF = REPO / "tests" / "e2e" / "workers" / "credential_thief.py"
NOBODY = 65534


def unprivileged() -> tuple[str, dict[str, str], int | None]:
    """The interpreter, extra environment and user (None: the test's) of an agent that
    is not root."""
    if os.geteuid() != 0:
        return sys.executable, {}, None
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python = shutil.which(version, path="/usr/local/bin:/usr/bin")
    assert python is not None, f"a {version} outside root's home runs the agent as nobody"
    paths = [sysconfig.get_paths()["purelib"], REPO / "shared", REPO / "services" / "node-agent"]
    extra = {"PYTHONPATH": os.pathsep.join(map(str, paths))}
    return python, extra, NOBODY


def start_agent(
    python: str, env: dict[str, str], user: int | None, log: Path, cwd: Path
) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(
            [python, "-m", "resurge_node_agent", "launch"],
            env=env, stdout=output, stderr=subprocess.STDOUT, cwd=cwd,
            user=user, group=user, extra_groups=None if user is None else [],
        )  # fmt: skip


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A folder of the agent's user, where it keeps its credentials file."""
    folder = Path(tempfile.mkdtemp(prefix="resurge-reach-"))
    if os.geteuid() == 0:
        os.chown(folder, NOBODY, NOBODY)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "plain"])
async def test_a_worker_finds_no_credentials_of_its_agent(
    bus: Bus,
    settings: Settings,
    raw_events: Events,
    tmp_path: Path,
    private_dir: Path,
    fork_server: bool,
) -> None:
    credentials = private_dir / "agent-n1.json"
    write_credentials(credentials, Credentials("agent-n1", "s3cret-password"))
    if os.geteuid() == 0:
        os.chown(credentials, NOBODY, NOBODY)
    python, extra, user = unprivileged()
    spec = WorkerGroupSpec(
        job=JOB, replica=0, node="n1", nproc=1, command=[python, str(THIEF)],
        stop_grace_seconds=1.0, fork_server=fork_server, preload=["json"],
    )  # fmt: skip
    # A plain nats-server without users takes any user; the agent holds these all the same.
    env = {
        **os.environ, **extra, "OMP_NUM_THREADS": "1",
        "RESURGE_NATS_CREDENTIALS": str(credentials), "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace, "RESURGE_LOG_FORMAT": "text",
        **spec_environment(spec),
    }  # fmt: skip
    log = tmp_path / "agent.log"
    agent = start_agent(python, env, user, log, private_dir)
    try:
        assign = Assign(
            source=bus.source, job=JOB, replica=0, generation=0, world_size=1,
            rank_table=[ReplicaSlot(replica=0, node="n1", first_rank=0, nproc=1)],
            master_addr="127.0.0.1", master_port=free_port(),
        )  # fmt: skip
        await bus.publish(bus.subjects.cmd(JOB, 0), assign)
        await raw_events.wait_for(lambda _: bool(raw_events.of(ProcessExited)), 60)
        lines = [e.line for e in raw_events.of(LogLine) if e.line.startswith("THIEF ")]
        assert len(lines) == 1, log.read_text()
        found = json.loads(lines[0].removeprefix("THIEF "))
        chain = [p["pid"] for p in found["processes"]]
        assert agent.pid in chain, found  # the worker descends from the agent
        # From the worker up to its agent (the test's own process is no part of it).
        reach = found["processes"][: chain.index(agent.pid) + 1]
        assert [p for p in reach if p.get("nats_variables")] == [], reach
        assert reach[-1].get("unreadable") == "PermissionError", reach[-1]  # the agent's
        assert "credentials" not in found
        await bus.publish(
            bus.subjects.cmd(JOB, 0),
            Stop(source=bus.source, job=JOB, replica=0, generation=0, final=True),
        )
        assert await asyncio.to_thread(agent.wait, 60) == 0
    finally:
        agent.kill()
