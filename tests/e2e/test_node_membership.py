"""`resurge node add`, `remove` and `describe` on a real local cluster, as a user runs them.

One cluster (one node of one GPU) serves the e2e tests here; each leaves it with only
``node-0``, uncordoned and idle.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from resurge.control.effects.nodes import REMOVING_REASON
from resurge.local.job_factory import python_job
from resurge.local.node_set import NodeSet
from resurge.local.state import ClusterState
from tests.e2e.test_local_cluster import alive, children, cmdline, resurge, wait_until

WORKER = Path(__file__).parent / "workers" / "progress_worker.py"


def nodes(state_dir: Path) -> dict[str, dict[str, object]]:
    listed = resurge(state_dir, "node", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {str(view["name"]): view for view in json.loads(listed.stdout)}


def monitor_pids(state_dir: Path, node: str) -> list[int]:
    state = ClusterState.load(state_dir)
    assert state is not None
    return [p for p in children(state.pid) if f"monitor --node {node} " in cmdline(p)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state_dir = tmp_path_factory.mktemp("membership") / "state"
    result = resurge(state_dir, "up", "--nodes", "1", "--gpus-per-node", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield state_dir
    finally:
        resurge(state_dir, "down")


@pytest.mark.e2e
def test_an_added_node_is_listed_with_its_gpus_and_labels_and_removed_again(
    cluster: Path,
) -> None:
    added = resurge(cluster, "node", "add", "--gpus", "3", "--label",
                    "topology.kubernetes.io/zone=a", "--label", "pool=spot")  # fmt: skip
    assert added.returncode == 0, added.stderr
    name = added.stdout.strip()
    assert name == "node-1"
    view = nodes(cluster)[name]
    assert (view["slots"], view["free"], view["cordoned"]) == (3, 3, False)
    assert view["labels"] == {"topology.kubernetes.io/zone": "a", "pool": "spot"}
    text = resurge(cluster, "node", "list").stdout
    assert "labels: pool=spot,topology.kubernetes.io/zone=a" in text
    [monitor] = monitor_pids(cluster, name)

    removed = resurge(cluster, "node", "remove", name)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.strip() == f"node {name} removed"
    assert set(nodes(cluster)) == {"node-0"}
    wait_until(lambda: not alive(monitor), 10)  # the supervisor reaps it at its next check
    node_set = NodeSet.load(cluster)
    assert node_set is not None and node_set.names == ["node-0"]
    again = resurge(cluster, "node", "add")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "node-2"  # a removed node's name is not used again
    assert nodes(cluster)["node-2"]["slots"] == 1  # the cluster's GPUs per node
    assert resurge(cluster, "node", "remove", "node-2").returncode == 0


@pytest.mark.e2e
def test_a_bad_label_or_an_unknown_node_is_refused_naming_it(cluster: Path) -> None:
    bad = resurge(cluster, "node", "add", "--label", "zone")
    assert bad.returncode == 2 and "label 'zone' is not key=value" in bad.stderr
    spaced = resurge(cluster, "node", "add", "--label", "my zone=a")
    assert spaced.returncode == 2 and "key name 'my zone'" in spaced.stderr
    unknown = resurge(cluster, "node", "remove", "node-9")
    assert unknown.returncode == 1
    assert "no node named 'node-9' in this local cluster (nodes: node-0)" in unknown.stderr
    assert set(nodes(cluster)) == {"node-0"}
    # describe reads the node health records as the viewer role, the restarter's bucket
    described = resurge(cluster, "node", "describe", "node-0")
    assert described.returncode == 0, described.stderr
    assert described.stdout.startswith("Node:         node-0\nSlots:        ")
    assert "\nScore:        " in described.stdout
    unknown = resurge(cluster, "node", "describe", "node-9")
    assert unknown.returncode == 1 and "no node 'node-9' in the cluster" in unknown.stderr


@pytest.mark.e2e
def test_removing_a_node_a_job_runs_on_times_out_naming_it_and_leaves_it_cordoned(
    cluster: Path, tmp_path: Path
) -> None:
    job = python_job("pinned", WORKER, "--steps", "100000", env={"OMP_NUM_THREADS": "1"})
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job.model_dump(mode="json", by_alias=True, exclude_none=True)))
    submitted = resurge(cluster, "submit", str(spec))
    assert submitted.returncode == 0, submitted.stderr
    try:
        wait_until(lambda: nodes(cluster)["node-0"]["jobs"] == ["pinned"], 60)
        # One node, one replica at least: the job can neither shrink nor move.
        removed = resurge(cluster, "node", "remove", "node-0", "--timeout", "2")
        assert removed.returncode == 1, removed.stdout + removed.stderr
        assert "node node-0 still runs worker groups of job(s) pinned after 2 s" in removed.stderr
        view = nodes(cluster)["node-0"]
        assert view["cordoned"] is True and view["cordonReason"] == REMOVING_REASON
        assert view["jobs"] == ["pinned"]
        assert len(monitor_pids(cluster, "node-0")) == 1
    finally:
        resurge(cluster, "delete", "pinned")
        resurge(cluster, "node", "uncordon", "node-0")


def test_node_add_away_from_any_cluster_says_so(tmp_path: Path) -> None:
    result = resurge(tmp_path / "none", "node", "add", timeout=20)
    assert result.returncode == 2
    assert f"no local cluster found in {tmp_path / 'none'}" in result.stderr
