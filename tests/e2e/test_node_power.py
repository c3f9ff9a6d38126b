"""A node that fails and comes back, as an operator sees it on a local cluster (and an
injected log line that nothing would read).

- After a fatal XID the job waits as Pending, its message naming the command that
  brings the node back; `resurge node uncordon` (the operator's word that the node was
  repaired) makes the simulated GPU healthy again and the job runs there again, with
  no `down`/`up` in between.
- `resurge inject node-down` is a power loss: the node's monitor, agents and workers
  die and stay down (the supervisor starts none of them again) while the job moves to
  the other node; `resurge node up` brings the node back.

The training script never imports resurge: a plain Python loop.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from resurge.local.job_factory import job
from resurge.local.state import ClusterState
from tests.e2e.test_local_cluster import alive, children, cmdline, resurge, wait_until

pytestmark = pytest.mark.e2e

PLAIN = "import time\nwhile True:\n    print('working', flush=True)\n    time.sleep(0.5)\n"


def submit_plain(state_dir: Path, tmp_path: Path, name: str) -> None:
    spec = job(name, [sys.executable, "-c", PLAIN], nproc=1, replicas=1)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_none=True)))
    submitted = resurge(state_dir, "submit", str(path))
    assert submitted.returncode == 0, submitted.stderr


def status(state_dir: Path, name: str) -> dict[str, Any]:
    result = resurge(state_dir, "status", name, "--json")
    assert result.returncode == 0, result.stderr
    view: dict[str, Any] = json.loads(result.stdout)
    return view


def nodes(state_dir: Path) -> dict[str, dict[str, Any]]:
    result = resurge(state_dir, "node", "list", "--json")
    assert result.returncode == 0, result.stderr
    return {n["name"]: n for n in json.loads(result.stdout)}


def node_pids(state_dir: Path, node: str) -> list[int]:
    """The node's monitor and every process below it, alive now."""
    state = ClusterState.load(state_dir)
    assert state is not None
    monitors = [p for p in children(state.pid) if f"monitor --node {node} " in cmdline(p)]
    return [p for p in [*monitors, *(c for m in monitors for c in children(m))] if alive(p)]


def up(state_dir: Path, count: int) -> None:
    result = resurge(state_dir, "up", "--nodes", str(count), "--gpus-per-node", "1")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    up(state, 1)
    try:
        yield state
    finally:
        resurge(state, "down")


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    up(state, 2)
    try:
        yield state
    finally:
        resurge(state, "down")


def test_uncordon_after_an_xid_repairs_the_node_and_the_waiting_job_runs_again(
    one_node: Path, tmp_path: Path
) -> None:
    submit_plain(one_node, tmp_path, "plain")
    wait_until(lambda: nodes(one_node)["node-0"]["jobs"] == ["plain"], 60)
    xid = resurge(one_node, "inject", "xid", "--node", "node-0", "--gpu", "0", "--code", "79")
    assert xid.returncode == 0, xid.stderr

    wait_until(lambda: status(one_node, "plain")["phase"] == "Pending", 60)
    wait_until(lambda: not nodes(one_node)["node-0"]["healthy"], 30)
    wait_until(lambda: "`resurge node uncordon node-0`" in status(one_node, "plain")["message"])

    uncordoned = resurge(one_node, "node", "uncordon", "node-0")
    assert uncordoned.returncode == 0, uncordoned.stderr
    wait_until(lambda: status(one_node, "plain")["phase"] == "Running", 60)
    view = nodes(one_node)["node-0"]
    assert view["healthy"] and not view["cordoned"] and view["jobs"] == ["plain"]
    assert status(one_node, "plain")["replicas"]["current"] == 1


def test_node_down_kills_the_whole_node_which_stays_down_until_node_up(
    two_nodes: Path, tmp_path: Path
) -> None:
    submit_plain(two_nodes, tmp_path, "plain")
    wait_until(lambda: any(n["jobs"] == ["plain"] for n in nodes(two_nodes).values()), 60)
    [home] = [name for name, n in nodes(two_nodes).items() if n["jobs"] == ["plain"]]
    [other] = [name for name in nodes(two_nodes) if name != home]
    before = node_pids(two_nodes, home)
    assert len(before) >= 2, "a monitor with the job's agent below it"

    down = resurge(two_nodes, "inject", "node-down", "--node", home)
    assert down.returncode == 0, down.stderr
    assert f"stay down until `resurge node up {home}`" in down.stdout
    assert not any(alive(pid) for pid in before)  # killed before the command returned
    listed = resurge(two_nodes, "node", "list").stdout  # at once, not after its heartbeat
    assert f"powered off (`resurge node up {home}`)" in listed, listed

    wait_until(lambda: nodes(two_nodes)[other]["jobs"] == ["plain"], 90)  # moved over
    wait_until(lambda: status(two_nodes, "plain")["phase"] == "Running", 60)
    assert node_pids(two_nodes, home) == []  # nothing of it was started again
    assert not nodes(two_nodes)[home]["reporting"]
    again = resurge(two_nodes, "inject", "node-down", "--node", home)
    assert again.returncode == 0 and "is down already" in again.stdout
    assert resurge(two_nodes, "down").returncode == 0
    restarted = resurge(two_nodes, "up")  # the same nodes: the powered-off one stays off
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert node_pids(two_nodes, home) == [] and node_pids(two_nodes, other)

    powered = resurge(two_nodes, "node", "up", home)
    assert powered.returncode == 0, powered.stderr
    assert powered.stdout.startswith(f"node {home} powered on\n")
    assert nodes(two_nodes)[home]["reporting"] and node_pids(two_nodes, home)
    unknown = resurge(two_nodes, "inject", "node-down", "--node", "node-9")
    assert unknown.returncode == 1 and "no node named 'node-9'" in unknown.stderr


def test_a_job_whose_only_node_lost_power_waits_naming_node_up_and_runs_after_it(
    one_node: Path, tmp_path: Path
) -> None:
    submit_plain(one_node, tmp_path, "plain")
    wait_until(lambda: nodes(one_node)["node-0"]["jobs"] == ["plain"], 60)
    down = resurge(one_node, "inject", "node-down", "--node", "node-0")
    assert down.returncode == 0, down.stderr

    wait_until(lambda: status(one_node, "plain")["phase"] == "Pending", 90)
    wait_until(lambda: "`resurge node up node-0`" in status(one_node, "plain")["message"], 30)
    assert "node-0 not reporting" in status(one_node, "plain")["message"]
    powered = resurge(one_node, "node", "up", "node-0")
    assert powered.returncode == 0, powered.stderr
    # Lost under the job, the node was cordoned: powered on is not yet "fit again".
    assert nodes(one_node)["node-0"]["cordoned"]
    assert "`resurge node uncordon node-0` lets it take work again" in powered.stdout
    wait_until(lambda: "uncordon node-0" in status(one_node, "plain")["message"], 30)
    assert resurge(one_node, "node", "uncordon", "node-0").returncode == 0
    wait_until(lambda: status(one_node, "plain")["phase"] == "Running", 90)
    assert nodes(one_node)["node-0"]["jobs"] == ["plain"]


def test_an_injected_log_line_on_a_job_without_log_rules_says_nothing_watches_it(
    one_node: Path, tmp_path: Path
) -> None:
    submit_plain(one_node, tmp_path, "plain")
    wait_until(lambda: status(one_node, "plain")["phase"] == "Running", 60)
    line = "RuntimeError: CUDA error: an illegal memory access was encountered"
    injected = resurge(one_node, "inject", "log", "--job", "plain", "--rank", "0", "--line", line)
    assert injected.returncode == 0, injected.stderr
    assert "injected log into rank 0 of plain" in injected.stdout
    assert "nothing watches plain's logs (its spec has no monitoring.logRules)" in injected.stdout
