"""A job deleted and submitted again under its name is a new run, through the CLI as a
user runs it: the new run runs, and its status and report show nothing of the old
run, which stays readable by its uid. The training scripts never import resurge, but
for the one that reports steps (tests/e2e/workers/progress_worker.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resurge.local.job_factory import python_job
from tests.e2e.local_cli import REPO, resurge, wait_until

PROGRESS = REPO / "tests" / "e2e" / "workers" / "progress_worker.py"

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    result = resurge(state_dir, "up", "--nodes", "1", "--gpus-per-node", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield state_dir
    finally:
        resurge(state_dir, "down")


def submit(cluster: Path, tmp_path: Path, name: str, script: str, *args: str, **spec: Any) -> None:
    job = python_job(name, script, *args, preload=None, forkServer=False, **spec)
    path = tmp_path / f"{name}-{time.monotonic_ns()}.yaml"
    path.write_text(json.dumps(job.model_dump(mode="json", by_alias=True, exclude_none=True)))
    result = resurge(cluster, "submit", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def status(cluster: Path, name: str, *more: str) -> dict[str, Any]:
    result = resurge(cluster, "status", name, "--json", *more)
    assert result.returncode == 0, result.stdout + result.stderr
    view: dict[str, Any] = json.loads(result.stdout)
    return view


def finished(cluster: Path, name: str, phase: str) -> dict[str, Any]:
    views: list[dict[str, Any]] = []

    def done() -> bool:
        views.append(status(cluster, name))
        return bool(views[-1]["phase"] == phase)

    wait_until(done)
    return views[-1]


def timeline_data(page: Path) -> dict[str, Any]:
    """The data a report page embeds (``<script id="timeline-data">``)."""
    data = page.read_text().split('id="timeline-data">')[1].split("</script>")[0]
    found: dict[str, Any] = json.loads(data)
    return found


def delete(cluster: Path, name: str) -> str:
    result = resurge(cluster, "delete", name)
    assert result.returncode == 0, result.stdout + result.stderr
    wait_until(lambda: resurge(cluster, "status", name, "--json").returncode == 1)
    return result.stdout


def test_a_failed_job_deleted_and_submitted_again_runs_and_shows_none_of_the_old_run(
    cluster: Path, tmp_path: Path
) -> None:
    # A crash loop spends its limit: process restarts, then a pod restart, then Failed.
    # Each generation leaves a file in the checkpoint folder the job was given.
    crash = (
        "import os, sys, time; folder = os.environ['RESURGE_CHECKPOINT_DIR']; "
        "os.makedirs(folder, exist_ok=True); "
        "open(os.path.join(folder, os.environ['RESURGE_GENERATION']), 'w').close(); "
        "time.sleep(0.2); sys.exit(3)"
    )
    recovery = {"jobMaxRetryCount": 3, "stopGraceSeconds": 2}
    submit(cluster, tmp_path, "again", "-c", crash, recovery=recovery)
    old = finished(cluster, "again", "Failed")
    assert sum(old["restarts"].values()) >= 1
    checkpoints = cluster / "checkpoints" / "again"  # a folder of the job's own
    assert (checkpoints / "0").is_file()
    deleted = delete(cluster, "again")
    assert f"checkpoints in {checkpoints} removed" in deleted
    assert not checkpoints.exists()

    submit(cluster, tmp_path, "again", "-c", "print('trained', flush=True)")
    new = finished(cluster, "again", "Succeeded")
    assert new["uid"] != old["uid"]
    assert new["generation"] == 0 and new["restarts"] == {}
    assert new["recentFaults"] == [] and new["recentRecoveries"] == []
    # The old run stays readable by its uid.
    before = status(cluster, "again", "--uid", old["uid"])
    assert before["phase"] == "Failed" and before["restarts"]
    assert len(before["recentFaults"]) >= 1


def test_a_succeeded_job_deleted_and_submitted_again_shows_only_its_own_steps(
    cluster: Path, tmp_path: Path
) -> None:
    steps = ("--step-seconds", "0.01")
    submit(cluster, tmp_path, "steps", str(PROGRESS), "--steps", "30", *steps)
    old = finished(cluster, "steps", "Succeeded")
    assert old["step"] == 30
    delete(cluster, "steps")

    submit(cluster, tmp_path, "steps", str(PROGRESS), "--steps", "7", *steps)
    new = finished(cluster, "steps", "Succeeded")
    assert new["step"] == 7 and new["uid"] != old["uid"]
    # The report of the new run, in a folder of the job's own by default.
    report = resurge(cluster, "report", "steps")
    assert report.returncode == 0, report.stderr
    page = cluster / "reports" / "steps" / "steps.html"
    assert str(page) in report.stdout.split()
    assert [step for _, step in timeline_data(page)["steps"]][-1] == 7
    # The old run's, by its uid.
    earlier = resurge(cluster, "report", "steps", "--uid", old["uid"], "--out", str(tmp_path))
    assert earlier.returncode == 0, earlier.stderr
    assert [step for _, step in timeline_data(tmp_path / "steps.html")["steps"]][-1] == 30
