"""The local cluster's wanted nodes (nodes.json), the supervisor's reconcile plan, node
labels as ``--label`` takes them, and the being-removed cordon."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from resurge.cluster import NodeInfo
from resurge.control.effects.nodes import REMOVING_REASON, is_being_removed, parse_label
from resurge.local.node_set import NodeEntry, NodeSet, editing, plan


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("topology.kubernetes.io/zone=a", ("topology.kubernetes.io/zone", "a")),
        ("pool=spot-1", ("pool", "spot-1")),
        ("empty=", ("empty", "")),
        ("a.b_c-d=x.y_z", ("a.b_c-d", "x.y_z")),
        ("k=" + "v" * 63, ("k", "v" * 63)),
    ],
)
def test_a_good_label_parses(text: str, expected: tuple[str, str]) -> None:
    assert parse_label(text) == expected


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("zone", "is not key=value"),
        ("=a", "key name ''"),
        ("-zone=a", "key name '-zone'"),
        ("my zone=a", "key name 'my zone'"),
        ("k" * 64 + "=a", "key name 'kkk"),
        ("Example.COM/zone=a", "key prefix 'Example.COM'"),
        ("/zone=a", "key prefix ''"),
        ("zone=a b", "value 'a b'"),
        ("zone=-a", "value '-a'"),
        ("zone=" + "v" * 64, "value 'vvv"),
    ],
)
def test_a_bad_label_is_refused_naming_it(text: str, named: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_label(text)
    assert f"label {text!r}" in str(refused.value) and named in str(refused.value)


def test_being_removed_is_the_removing_cordon_only() -> None:
    node = NodeInfo(name="n", slots=1)
    assert not is_being_removed(node)
    by_hand = node.model_copy(update={"cordoned": True, "cordon_reason": "cordoned by hand"})
    assert not is_being_removed(by_hand)
    removing = node.model_copy(update={"cordoned": True, "cordon_reason": REMOVING_REASON})
    assert is_being_removed(removing)


def test_added_nodes_take_the_next_index_never_used_and_the_default_gpus() -> None:
    node_set = NodeSet.fresh(2, gpus_per_node=4)
    assert node_set.names == ["node-0", "node-1"]
    assert [n.gpus for n in node_set.nodes] == [4, 4]
    added = node_set.add(labels={"zone": "a"})
    assert added == NodeEntry("node-2", 4, {"zone": "a"})
    node_set.remove("node-2")
    node_set.remove("node-0")
    assert node_set.add(gpus=1) == NodeEntry("node-3", 1, {})
    assert node_set.names == ["node-1", "node-3"]
    with pytest.raises(LookupError, match=r"no node named 'node-0' .*\(nodes: node-1, node-3\)"):
        node_set.remove("node-0")


def test_the_set_survives_a_save_and_a_load(tmp_path: Path) -> None:
    assert NodeSet.load(tmp_path) is None
    node_set = NodeSet.fresh(1, gpus_per_node=2)
    node_set.add(gpus=3, labels={"topology.kubernetes.io/zone": "b"})
    node_set.save(tmp_path)
    assert NodeSet.load(tmp_path) == node_set
    NodeSet.path(tmp_path).write_text("{not json")
    assert NodeSet.load(tmp_path) is None


def test_editing_writes_back_only_a_finished_change(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no node set"), editing(tmp_path):
        pass
    NodeSet.fresh(1, 1).save(tmp_path)
    with editing(tmp_path) as node_set:
        node_set.add()
    with pytest.raises(LookupError), editing(tmp_path) as node_set:
        node_set.add()
        node_set.remove("node-9")
    loaded = NodeSet.load(tmp_path)
    assert loaded is not None and loaded.names == ["node-0", "node-1"]


def _add_many(state_dir: Path, count: int) -> None:
    for _ in range(count):
        with editing(state_dir) as node_set:
            node_set.add()


def test_editors_in_other_processes_never_lose_each_others_nodes(tmp_path: Path) -> None:
    NodeSet.fresh(0, 1).save(tmp_path)
    context = multiprocessing.get_context("spawn")
    editors = [context.Process(target=_add_many, args=(tmp_path, 10)) for _ in range(3)]
    for editor in editors:
        editor.start()
    for editor in editors:
        editor.join(60)
        assert editor.exitcode == 0
    loaded = NodeSet.load(tmp_path)
    assert loaded is not None
    assert sorted(loaded.names) == sorted(f"node-{i}" for i in range(30))


def test_the_plan_starts_the_wanted_and_stops_the_unwanted_or_changed() -> None:
    a, b, c = NodeEntry("node-0", 2), NodeEntry("node-1", 2), NodeEntry("node-2", 1)
    assert plan([a, b], {}).start == [a, b]
    steady = plan([a, b], {"node-0": a, "node-1": b})
    assert (steady.start, steady.stop) == ([], [])
    changed = plan([a, c], {"node-0": a, "node-1": b})
    assert (changed.start, changed.stop) == ([c], ["node-1"])
    relabelled = NodeEntry("node-0", 2, {"zone": "a"})
    again = plan([relabelled], {"node-0": a})
    assert (again.start, again.stop) == ([], ["node-0"])  # started anew once it stopped
    assert plan([relabelled], {}).start == [relabelled]


def test_a_node_powers_off_and_on_in_the_file_and_the_plan_leaves_its_monitor_alone(
    tmp_path: Path,
) -> None:
    node_set = NodeSet.fresh(2, gpus_per_node=1)
    assert node_set.power("node-1", on=False) and not node_set.power("node-1", on=False)
    node_set.save(tmp_path)
    loaded = NodeSet.load(tmp_path)
    assert loaded is not None and [n.down for n in loaded.nodes] == [False, True]
    running = {n.name: NodeEntry(n.name, n.gpus) for n in loaded.nodes}
    kept = plan(loaded.nodes, running)  # the supervisor powers it off itself
    assert (kept.start, kept.stop) == ([], [])
    assert loaded.power("node-1", on=True)
    assert not loaded.known("node-1").down
    with pytest.raises(LookupError, match=r"no node named 'node-7'.*node-0, node-1"):
        loaded.power("node-7", on=False)


def test_a_monitor_runs_with_the_nodes_gpus_and_labels(tmp_path: Path) -> None:
    node = NodeEntry("node-4", 3, {"zone": "a", "pool": "spot"})
    assert node.monitor_args(tmp_path) == [
        "monitor", "--node", "node-4", "--gpus", "3",
        "--label", "pool=spot", "--label", "zone=a", "--log-dir", str(tmp_path),
    ]  # fmt: skip


def test_the_node_monitor_refuses_a_bad_label_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from resurge_node_agent.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["monitor", "--node", "n", "--label", "zone=a", "--label", "Zone/x=a"])
    assert refused.value.code == 2
    assert "--label: label 'Zone/x=a': key prefix 'Zone'" in capsys.readouterr().err
