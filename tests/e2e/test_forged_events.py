"""One team's worker cannot act on another team's job, on a local cluster as a user runs
it (`resurge up`, NATS with users).

Reproduced before: job A's worker, a plain script that never imports resurge
(tests/e2e/workers/credential_thief.py), found its agent's credentials through `/proc`,
and with them published a SIGKILL of job B's rank 0 (B, on the same node, restarted for
a pid that never existed) and an XID 79 of the node (it was cordoned). Here it tries
that with the credentials its agent holds (what it finds in `/proc`; a worker running
as root reads them whatever is done, docs/security.md), plus an exit naming B's rank 0
on A's own subject. The server refuses the first two (A's agent may publish only A's
raw subjects on its node), the detector dead-letters the third, and B runs on untouched.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from resurge.access.permissions import job_agent_user
from resurge.contract.subjects import Subjects
from resurge.events import (
    DeadLetter,
    DeadLetterReason,
    Event,
    GpuError,
    ProcessExited,
    Source,
    encode_event,
)
from resurge.local.job_factory import python_job
from resurge.local.state import ClusterState, credentials_path
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from tests.e2e.local_cli import REPO, resurge, wait_until

THIEF = REPO / "tests" / "e2e" / "workers" / "credential_thief.py"
NODE = "node-0"
TEAM_A, TEAM_B = "team-a", "team-b"

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    result = resurge(state_dir, "up", "--nodes", "1", "--gpus-per-node", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield state_dir
    finally:
        resurge(state_dir, "down")


def submit(cluster: Path, tmp_path: Path, name: str, script: Path, *args: str) -> None:
    job = python_job(name, script, *args, preload=None, forkServer=False)
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(job.model_dump(mode="json", by_alias=True, exclude_none=True)))
    result = resurge(cluster, "submit", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def status(cluster: Path, name: str) -> dict[str, Any]:
    result = resurge(cluster, "status", name, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    view: dict[str, Any] = json.loads(result.stdout)
    return view


def forgeries(subjects: Subjects) -> list[dict[str, Any]]:
    """B's rank 0 killed (on A's subject, and on B's), the node's GPU 0 fallen off."""
    source = Source(service="node-agent", instance=f"{NODE}:1")
    where: dict[str, Any] = {"source": source, "replica": 0, "node": NODE, "generation": 0}
    kill = ProcessExited(
        job=TEAM_B, rank=0, pid=999_999, local_rank=0, local_world_size=1, exit_code=None,
        signal="SIGKILL", **where,
    )  # fmt: skip
    xid = GpuError(source=source, node=NODE, gpu=0, error="xid", xid=79, message="fell off")
    return [
        {"subject": subjects.raw(TEAM_A, "process_exited", NODE), "body": kill},
        {"subject": subjects.raw(TEAM_B, "process_exited", NODE), "body": kill},
        {"subject": subjects.raw("_", "gpu_error", NODE), "body": xid},
    ]


async def refused(cluster: Path, mismatch: str, run_thief: Callable[[], None]) -> DeadLetter:
    """Run the thief while watching, as the cluster's viewer, for the detector's dead
    letter of the exit it forged on ``mismatch`` (its own job's subject)."""
    state = ClusterState.load(cluster)
    assert state is not None
    settings = Settings(
        nats_url=state.nats_url,
        namespace=state.namespace,
        nats_credentials=credentials_path(cluster, "viewer"),
    )
    bus = await Bus.connect(settings, "test")
    found: asyncio.Future[DeadLetter] = asyncio.get_running_loop().create_future()

    async def on(event: Event, _subject: str) -> None:
        if (
            isinstance(event, DeadLetter)
            and event.reason is DeadLetterReason.SUBJECT_MISMATCH
            and event.subject == mismatch
            and not found.done()
        ):
            found.set_result(event)

    try:
        await bus.subscribe(bus.subjects.all("dlq"), on)
        await bus.nc.flush()
        await asyncio.to_thread(run_thief)
        return await asyncio.wait_for(found, 180)
    finally:
        await bus.close()


def test_a_worker_of_one_job_cannot_kill_another_jobs_rank_or_cordon_its_node(
    cluster: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.py"
    victim.write_text("import time\nprint('b trains', flush=True)\ntime.sleep(600)\n")
    submit(cluster, tmp_path, TEAM_B, victim)
    wait_until(lambda: status(cluster, TEAM_B)["phase"] == "Running")
    state = ClusterState.load(cluster)
    assert state is not None
    subjects = Subjects(state.namespace)
    forge = tmp_path / "forge.json"
    forge.write_text(
        json.dumps(
            [{**m, "body": json.loads(encode_event(m["body"]))} for m in forgeries(subjects)]
        )
    )
    report = tmp_path / "thief.json"
    agents_own = credentials_path(cluster, job_agent_user(NODE, TEAM_A))
    mismatch = forgeries(subjects)[0]["subject"]

    def run_thief() -> None:
        submit(
            cluster, tmp_path, TEAM_A, THIEF, "--forge", str(forge), "--url", state.nats_url,
            "--credentials", str(agents_own), "--report", str(report),
        )  # fmt: skip

    letter = asyncio.run(refused(cluster, mismatch, run_thief))
    assert TEAM_B in letter.detail, letter.detail

    def tried(count: int) -> Callable[[], bool]:
        return lambda: report.exists() and len(json.loads(report.read_text())["published"]) >= count

    wait_until(tried(2))  # a forgery that works kills this worker before the next
    assert json.loads(report.read_text())["published"][1] != "sent"  # on B's subject
    wait_until(tried(3))
    found = json.loads(report.read_text())
    assert found["credentials"]["user"] == job_agent_user(NODE, TEAM_A), found  # its agent's
    published = found["published"]
    assert isinstance(published, list), found
    assert published[0] == "sent", published  # its own subject: the detector refuses it
    assert "permissions violation" in published[1].lower(), published  # B's subject
    assert "permissions violation" in published[2].lower(), published  # a node's GPU
    wait_until(lambda: status(cluster, TEAM_A)["phase"] == "Succeeded")
    view = status(cluster, TEAM_B)
    assert view["phase"] == "Running", view
    assert view["generation"] == 0 and view["restarts"] == {}, view
    assert view["recentFaults"] == [], view
    nodes = json.loads(resurge(cluster, "node", "list", "--json").stdout)
    assert [n for n in nodes if n["name"] == NODE and n.get("cordoned")] == [], nodes
