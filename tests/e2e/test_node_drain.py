"""`resurge node drain` of a node under jobs, as a user runs it: the job that runs
``resurge.worker`` is checkpointed first, then moved; the plain script's job (it never
imports resurge: nothing to ask a checkpoint of) is moved at once; the command says
which, and the node stays cordoned."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from resurge.local.job_factory import python_job
from tests.e2e.local_cli import resurge, wait_until

WORKER = Path(__file__).parent / "workers" / "checkpoint_worker.py"

pytestmark = pytest.mark.e2e


def nodes(state_dir: Path) -> dict[str, dict[str, object]]:
    listed = resurge(state_dir, "node", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {str(view["name"]): view for view in json.loads(listed.stdout)}


def jobs_on(state_dir: Path, node: str) -> list[str]:
    listed = nodes(state_dir)[node]["jobs"]
    assert isinstance(listed, list)
    return sorted(str(job) for job in listed)


def status(state_dir: Path, job: str) -> dict[str, object]:
    shown = resurge(state_dir, "status", job, "--json")
    assert shown.returncode == 0, shown.stderr
    found: dict[str, object] = json.loads(shown.stdout)
    return found


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    result = resurge(state_dir, "up", "--nodes", "1", "--gpus-per-node", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield state_dir
    finally:
        resurge(state_dir, "down")


def test_a_drain_checkpoints_the_job_first_then_moves_both_jobs_off(
    cluster: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    jobs = {
        "ck": python_job("ck", WORKER, "--checkpoint-dir", str(checkpoints)),
        "plain": python_job("plain", WORKER, "--checkpoint-dir", str(checkpoints),
                            "--plain-rank", "0"),
    }  # fmt: skip
    for name, job in jobs.items():
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(
            yaml.safe_dump(job.model_dump(mode="json", by_alias=True, exclude_none=True))
        )
        submitted = resurge(cluster, "submit", str(spec))
        assert submitted.returncode == 0, submitted.stderr
    wait_until(lambda: jobs_on(cluster, "node-0") == ["ck", "plain"], 90)
    wait_until(lambda: status(cluster, "ck")["phase"] == "Running", 60)
    added = resurge(cluster, "node", "add", "--gpus", "2")
    assert added.returncode == 0, added.stderr
    spare = added.stdout.strip()

    drained = resurge(cluster, "node", "drain", "node-0", "--timeout", "120", timeout=180)

    assert drained.returncode == 0, drained.stdout + drained.stderr
    said = re.search(r"job ck: checkpointed step (\d+), then moved", drained.stdout)
    assert said is not None, drained.stdout
    assert "job plain: moved at once: its workers do not run resurge.worker" in drained.stdout
    step = int(said.group(1))
    assert (checkpoints / f"step-{step}" / "rank-0").read_text() == f"{step}\n"
    wait_until(lambda: jobs_on(cluster, spare) == ["ck", "plain"], 90)
    drained_node = nodes(cluster)["node-0"]
    assert drained_node["cordoned"] is True and drained_node["jobs"] == []
    assert "drained" in str(drained_node["cordonReason"])
    moved = status(cluster, "ck")
    assert moved["latestCheckpoint"] == {"step": step, "path": str(checkpoints / f"step-{step}")}
    assert moved["restarts"] == {"node": 1}
    described = resurge(cluster, "node", "describe", "node-0", "--json")
    assert described.returncode == 0, described.stderr
