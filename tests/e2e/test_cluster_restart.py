"""State that must survive: `down`/`up` mid-job, and a cordon a user can see and lift.

As a user runs it: `resurge up` in a state folder (real nats-server with its data
there, the services, two virtual nodes of two simulated GPUs), the DDP example
submitted from a YAML file, everything through the `resurge` command.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_local_cluster import REPO, resurge, wait_until

pytestmark = pytest.mark.e2e


def example(tmp_path: Path, steps: int) -> Path:
    """The DDP example as a user would copy it: more steps, checkpoints in ``tmp_path``."""
    job = yaml.safe_load((REPO / "examples" / "ddp" / "job.yaml").read_text())
    command = job["spec"]["command"]
    command[command.index("--steps") + 1] = str(steps)
    job["spec"]["env"].append({"name": "RESURGE_CHECKPOINT_DIR", "value": str(tmp_path / "ckpt")})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def status(state_dir: Path) -> dict[str, Any]:
    result = resurge(state_dir, "status", "ddp-example", "--json")
    assert result.returncode == 0, result.stderr
    view: dict[str, Any] = json.loads(result.stdout)
    return view


def nodes(state_dir: Path) -> dict[str, dict[str, Any]]:
    result = resurge(state_dir, "node", "list", "--json")
    assert result.returncode == 0, result.stderr
    return {n["name"]: n for n in json.loads(result.stdout)}


def up(state_dir: Path) -> None:
    result = resurge(state_dir, "up", "--nodes", "2", "--gpus-per-node", "2")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    up(state)
    try:
        yield state
    finally:
        resurge(state, "down")


def agent_logs(state_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted((state_dir / "logs").glob("agent-ddp-example-*")))


def test_a_job_running_at_down_resumes_from_its_checkpoint_after_up(
    state_dir: Path, tmp_path: Path
) -> None:
    assert resurge(state_dir, "submit", str(example(tmp_path, 400))).returncode == 0
    wait_until(lambda: (status(state_dir).get("latestCheckpoint") or {}).get("step", 0) >= 20, 90)
    before = status(state_dir)
    assert resurge(state_dir, "down").returncode == 0
    up(state_dir)

    after = status(state_dir)
    assert after["phase"] in ("Pending", "Running") and after["generation"] > before["generation"]
    saved = after["latestCheckpoint"]["step"]
    assert saved >= 20
    wait_until(lambda: status(state_dir)["phase"] == "Succeeded", 150)
    assert f"at step {saved + 1} " in agent_logs(state_dir)  # "resuming from ... at step N"
    final = status(state_dir)
    assert final["restarts"] == before["restarts"]  # a restart of the cluster, not of the job
    assert final["lostSeconds"]["cluster_down"] > 0  # lost time, by its own cause
    assert final["lostSeconds"]["waiting_for_capacity"] == 0


def test_no_room_after_an_xid_waits_as_pending_saying_why_until_uncordoned(
    state_dir: Path, tmp_path: Path
) -> None:
    assert resurge(state_dir, "submit", str(example(tmp_path, 300))).returncode == 0
    wait_until(lambda: (status(state_dir).get("latestCheckpoint") or {}).get("step", 0) >= 10, 90)
    assert resurge(state_dir, "inject", "xid", "--node", "node-0", "--gpu", "0",
                   "--code", "79").returncode == 0  # fmt: skip

    wait_until(lambda: status(state_dir)["phase"] == "Pending", 30)
    wait_until(lambda: all(n["free"] == 2 for n in nodes(state_dir).values()), 30)
    listed = nodes(state_dir)
    # The XID also makes node-0's health report unhealthy: the two faults are one incident,
    # and the cordon names whichever of them the restarter acted on first.
    reason = listed["node-0"]["cordonReason"]
    assert listed["node-0"]["cordoned"] and reason.split()[0] in {"gpu_xid", "node_unhealthy"}
    assert listed["node-1"] == {**listed["node-1"], "free": 2, "jobs": []}  # never shared
    pending = status(state_dir)
    assert pending["replicas"]["current"] == 0 and pending["avoidNodes"] == ["node-0"]
    wait_until(lambda: "node-0 avoided by this job" in status(state_dir)["message"], 30)

    assert resurge(state_dir, "down").returncode == 0
    up(state_dir)  # the cordon outlives down and up, as a Kubernetes node's does
    assert nodes(state_dir)["node-0"]["cordoned"]
    wait_until(lambda: "node-0 avoided by this job" in status(state_dir)["message"], 30)
    assert status(state_dir)["phase"] == "Pending"

    uncordoned = resurge(state_dir, "node", "uncordon", "node-0")
    assert uncordoned.returncode == 0, uncordoned.stderr
    assert not nodes(state_dir)["node-0"]["cordoned"]
    wait_until(lambda: status(state_dir)["phase"] == "Succeeded", 150)
    assert status(state_dir)["avoidNodes"] == []
    unknown = resurge(state_dir, "node", "uncordon", "node-9")
    assert unknown.returncode == 1 and "no node named 'node-9'" in unknown.stderr
