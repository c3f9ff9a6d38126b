"""The local cluster's wanted nodes: ``nodes.json`` in the state folder.

The file holds the nodes the cluster should run (name, GPUs, labels, and whether it is
powered off), the GPUs a node gets by default, and the index the next added node is
named after. ``resurge node add`` and ``remove`` (and ``resurge inject node-down`` and
``resurge node up``, which power a node off and on) change it under ``nodes.lock``
(:func:`editing`: read, change, write atomically), and the supervisor reconciles its
node monitors against it (:func:`plan`), as a controller reconciles against a desired
state.

Why a file, not a request to the supervisor: it is the desired state itself, so it
outlives every process. A supervisor that crashes or is stopped (``resurge down``)
and started again runs the same nodes, added ones and their labels included; a
command that dies halfway leaves either the old set or the new one, never half of each;
and the supervisor needs no server of its own, as it already wakes every 0.2 s.

Names are ``node-<i>``; an added node gets the next index never used in this folder,
so a node added after one was removed never takes its name, and jobs that avoid the
old node (after a fault) do not avoid the new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

__all__ = ["NodeEntry", "NodeSet", "Plan", "editing", "plan"]


@dataclass(frozen=True)
class NodeEntry:
    """One wanted node: what its monitor is started with."""

    name: str
    gpus: int
    labels: dict[str, str] = field(default_factory=dict)
    down: bool = False  # powered off (`resurge inject node-down`): no process of it runs

    def monitor_args(self, log_dir: Path) -> list[str]:
        """The ``resurge-node-agent`` arguments that run this node's monitor."""
        args = ["monitor", "--node", self.name, "--gpus", str(self.gpus)]
        for key, value in sorted(self.labels.items()):
            args += ["--label", f"{key}={value}"]
        return [*args, "--log-dir", str(log_dir)]


@dataclass
class NodeSet:
    """The nodes a local cluster should run (``nodes.json``)."""

    gpus_per_node: int
    nodes: list[NodeEntry]
    next_index: int

    @staticmethod
    def path(state_dir: Path) -> Path:
        """Where the set lives in ``state_dir``."""
        return state_dir / "nodes.json"

    @classmethod
    def fresh(cls, count: int, gpus_per_node: int) -> NodeSet:
        """``count`` nodes ``node-0`` upwards with ``gpus_per_node`` GPUs each."""
        nodes = [NodeEntry(f"node-{i}", gpus_per_node) for i in range(count)]
        return cls(gpus_per_node, nodes, next_index=count)

    @classmethod
    def load(cls, state_dir: Path) -> NodeSet | None:
        """The set in ``state_dir``; None when there is none (or it is unreadable)."""
        try:
            data = json.loads(cls.path(state_dir).read_text())
            nodes = [NodeEntry(**entry) for entry in data["nodes"]]
            return cls(int(data["gpus_per_node"]), nodes, int(data["next_index"]))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def save(self, state_dir: Path) -> None:
        """Write the set to ``state_dir``, replacing the old one atomically."""
        tmp = self.path(state_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(self.path(state_dir))

    @property
    def names(self) -> list[str]:
        """The wanted nodes' names, in the order they were added."""
        return [node.name for node in self.nodes]

    def get(self, name: str) -> NodeEntry | None:
        """The wanted node called ``name``; None if there is none."""
        return next((node for node in self.nodes if node.name == name), None)

    def add(self, gpus: int | None = None, labels: dict[str, str] | None = None) -> NodeEntry:
        """Add a node named after the next unused index (``gpus`` default: the set's)."""
        entry = NodeEntry(
            f"node-{self.next_index}",
            self.gpus_per_node if gpus is None else gpus,
            dict(labels or {}),
        )
        self.nodes.append(entry)
        self.next_index += 1
        return entry

    def remove(self, name: str) -> None:
        """Drop ``name``; :class:`LookupError`, naming the wanted nodes, if it is not one."""
        self.known(name)
        self.nodes = [node for node in self.nodes if node.name != name]

    def known(self, name: str) -> NodeEntry:
        """The wanted node ``name``; :class:`LookupError`, naming the wanted nodes, if it
        is not one."""
        entry = self.get(name)
        if entry is None:
            known = ", ".join(self.names) or "none"
            raise LookupError(f"no node named {name!r} in this local cluster (nodes: {known})")
        return entry

    def power(self, name: str, on: bool) -> bool:
        """Power ``name`` on or off; whether that changed it (:meth:`known`'s error)."""
        entry = self.known(name)
        if entry.down is not on:
            return False
        self.nodes = [replace(n, down=not on) if n.name == name else n for n in self.nodes]
        return True


@contextlib.contextmanager
def editing(state_dir: Path) -> Iterator[NodeSet]:
    """The folder's node set, locked against other editors; written back when the block
    ends without an exception. :class:`FileNotFoundError` when the folder has none."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / "nodes.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        node_set = NodeSet.load(state_dir)
        if node_set is None:
            raise FileNotFoundError(f"no node set in {state_dir} ({NodeSet.path(state_dir)})")
        yield node_set
        node_set.save(state_dir)


@dataclass(frozen=True)
class Plan:
    """What the supervisor does to make its running monitors match the wanted nodes."""

    start: list[NodeEntry]
    stop: list[str]


def plan(wanted: list[NodeEntry], running: dict[str, NodeEntry]) -> Plan:
    """Start each wanted node no monitor runs for; stop each running one not wanted.

    A node wanted with other GPUs or labels than its monitor runs with is stopped now
    and started again (with the new ones) once it has stopped. Powering a node off or on
    (``down``) is no change here: the supervisor kills or starts its monitor itself."""
    names = {node.name: replace(node, down=False) for node in wanted}
    stop = [name for name, node in running.items() if names.get(name) != replace(node, down=False)]
    start = [node for node in wanted if node.name not in running]
    return Plan(start=start, stop=sorted(stop))
