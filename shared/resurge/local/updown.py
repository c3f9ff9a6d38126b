"""``resurge up`` and ``resurge down``: the local cluster in the background.

``up`` starts ``python -m resurge.local.supervisor`` in a session of its own and returns
once it reports ready through a pipe; a second ``up`` on a folder whose supervisor is
running says so and exits 1. Without ``--nodes`` and ``--gpus-per-node`` it runs the
nodes an earlier run of the folder had (``nodes.json``, with nodes added by ``resurge
node add``), else 2 nodes of 2 GPUs; with either, that many fresh nodes. ``down``
sends the supervisor SIGTERM and waits until it has stopped everything and released the
folder's lock.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from resurge.local.node_set import NodeSet
from resurge.local.state import ClusterState, StateLock
from resurge.local.supervisor import Supervisor, serve
from resurge.runtime.logs import configure_logging

__all__ = ["DEFAULT_GPUS_PER_NODE", "DEFAULT_NODES", "down", "up"]

DEFAULT_NODES = 2
DEFAULT_GPUS_PER_NODE = 2


def up(
    state_dir: Path,
    nodes: int | None,
    gpus_per_node: int | None,
    port: int,
    foreground: bool,
    nats_servers: int = 1,
) -> int:
    """Start the local cluster in ``state_dir`` (here if ``foreground``); the exit status.

    ``nodes`` and ``gpus_per_node`` None: the nodes of the folder's earlier run, if any.
    ``nats_servers`` above 1: a NATS cluster of that many servers (``port`` is ignored)."""
    keep_nodes = nodes is None and gpus_per_node is None
    nodes = DEFAULT_NODES if nodes is None else nodes
    gpus_per_node = DEFAULT_GPUS_PER_NODE if gpus_per_node is None else gpus_per_node
    if nodes < 1 or gpus_per_node < 1:
        print("resurge up: --nodes and --gpus-per-node must be at least 1", file=sys.stderr)
        return 2
    if nats_servers not in (1, 3, 5):
        print("resurge up: --nats-cluster must be 1, 3 or 5 servers", file=sys.stderr)
        return 2
    if StateLock(state_dir).held_elsewhere():
        state = ClusterState.load(state_dir)
        where = f" (nats at {state.nats_url})" if state else ""
        print(f"resurge is already up in {state_dir}{where}; `resurge down` stops it")
        return 1
    if foreground:
        supervisor = Supervisor(
            state_dir,
            nodes,
            gpus_per_node,
            nats_port=port,
            keep_nodes=keep_nodes,
            nats_servers=nats_servers,
        )
        configure_logging("supervisor", fmt="text")
        print(f"starting the local cluster in {state_dir} (Ctrl-C stops it)", flush=True)
        return serve(supervisor, ready_fd=None)
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    argv = [sys.executable, "-m", "resurge.local.supervisor", "--state-dir", str(state_dir)]
    argv += ["--nodes", str(nodes), "--gpus-per-node", str(gpus_per_node)]
    argv += ["--port", str(port), "--ready-fd", str(write_end)]
    argv += ["--nats-cluster", str(nats_servers)]
    argv += ["--keep-nodes"] if keep_nodes else []
    with (state_dir / "logs" / "supervisor.log").open("ab") as log:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(write_end,),
            start_new_session=True,
        )
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], 120)
    said = os.read(read_end, 64) if ready else b""
    os.close(read_end)
    state = ClusterState.load(state_dir)
    if said.strip() != b"ready" or state is None:
        print(f"resurge up failed; see {state_dir / 'logs' / 'supervisor.log'}", file=sys.stderr)
        return 1
    print(f"resurge is up in {state_dir}: nats at {state.nats_url}, {_nodes_line(state_dir)}")
    print(f"logs: {state_dir / 'logs'}; stop it with `resurge down`")
    return 0


def _nodes_line(state_dir: Path) -> str:
    """``2 node(s) x 2 GPU(s)``, or each node's GPUs where they differ."""
    node_set = NodeSet.load(state_dir)
    if node_set is None:
        return "no nodes"
    gpus = {node.gpus for node in node_set.nodes}
    if len(gpus) == 1:
        return f"{len(node_set.nodes)} node(s) x {gpus.pop()} GPU(s)"
    each = ", ".join(f"{node.name} x {node.gpus}" for node in node_set.nodes)
    return f"{len(node_set.nodes)} nodes ({each} GPU(s))"


def _running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaps counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def down(state_dir: Path, wait_seconds: float = 60.0) -> int:
    """Stop the local cluster in ``state_dir`` and wait until it is gone; the exit status."""
    state = ClusterState.load(state_dir)
    lock = StateLock(state_dir)
    if state is None or not lock.held_elsewhere():
        print(f"resurge is not up in {state_dir}")
        return 0
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_seconds
    while lock.held_elsewhere() or _running(state.pid):
        if time.monotonic() > deadline:
            print(f"resurge down: supervisor {state.pid} did not stop in time", file=sys.stderr)
            return 1
        time.sleep(0.1)  # another process's exit: polled, bounded
    print(f"resurge is down ({state_dir})")
    return 0
