"""`resurge up` / `down` as a user runs them: background cluster, one per state folder,
services supervised like a Deployment, nothing left running after `down`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from resurge.local.state import ClusterState

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def resurge(state_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESURGE_")}
    return subprocess.run(
        [str(BIN / "resurge"), "--state-dir", str(state_dir), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO,
    )  # fmt: skip


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (through /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            child = int(entry.name)
            found += [child, *children(child)]
    return found


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a parent that never reaps it)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def wait_until(test: Callable[[], object], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)  # another process's progress: polled, bounded


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    result = resurge(state_dir, "up", "--nodes", "2", "--gpus-per-node", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield state_dir
    finally:
        resurge(state_dir, "down")


def test_up_is_ready_refuses_a_second_up_and_finds_itself(cluster: Path) -> None:
    state = ClusterState.load(cluster)
    assert state is not None and state.nodes == ["node-0", "node-1"]
    again = resurge(cluster, "up")
    assert again.returncode == 1 and "already up" in again.stdout
    status = resurge(cluster, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout) == []
    assert (cluster / "logs" / "scaler.log").is_file()


def test_a_dead_service_is_started_again_and_down_leaves_nothing(cluster: Path) -> None:
    state = ClusterState.load(cluster)
    assert state is not None
    [detector] = [p for p in children(state.pid) if "-m resurge_detector" in cmdline(p)]
    os.kill(detector, signal.SIGKILL)
    log = cluster / "logs" / "supervisor.log"
    wait_until(lambda: "detector started again" in log.read_text())
    assert "detector exited with code -9" in log.read_text()
    [again] = [p for p in children(state.pid) if "-m resurge_detector" in cmdline(p)]
    assert again != detector

    running = children(state.pid)
    assert len(running) >= 5  # 3 services, 2 node monitors, nats-server
    down = resurge(cluster, "down")
    assert down.returncode == 0 and "resurge is down" in down.stdout
    assert not alive(state.pid)
    assert [p for p in running if alive(p)] == []
    assert ClusterState.load(cluster) is None
    assert "not up" in resurge(cluster, "down").stdout


def test_submit_inject_and_status_through_the_cli(cluster: Path) -> None:
    submitted = resurge(cluster, "submit", "examples/crash_once/job.yaml")
    assert submitted.returncode == 0, submitted.stderr

    def phase() -> str:
        return str(json.loads(resurge(cluster, "status", "crash-once", "--json").stdout)["phase"])

    wait_until(lambda: phase() == "Succeeded", 60)
    view = json.loads(resurge(cluster, "status", "crash-once", "--json").stdout)
    assert view["restarts"] == {"process": 1} and view["generation"] == 1
    assert view["lastFault"]["reason"] == "process_crash"
    assert view["replicas"] == {"current": 2, "target": 2}
    missing = resurge(cluster, "inject", "crash", "--job", "nope", "--rank", "0")
    assert missing.returncode == 1 and "no job named 'nope'" in missing.stderr
    out_of_range = resurge(cluster, "inject", "hang", "--job", "crash-once", "--rank", "9")
    assert out_of_range.returncode == 1 and "world size 4" in out_of_range.stderr
