"""``resurge node``: list nodes, cordon or uncordon one; add, remove or power on one of
the local cluster in the state folder (those three ignore ``RESURGE_NATS_URL``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from resurge.cli.arguments import label, positive
from resurge.cli.connect import on_bus

if TYPE_CHECKING:
    from resurge.runtime.bus import Bus

__all__ = ["add_parser", "run"]

# The subcommands that change the local cluster's processes, not the bus's records.
_LOCAL = ("add", "remove", "up")


def add_parser(commands: Any) -> None:
    """Register ``node`` and its subcommands."""
    node = commands.add_parser(
        "node",
        help="list nodes, cordon or uncordon one; add, remove or power on one of a local cluster",
        description="Nodes of the cluster: their slots, health, labels and cordons. A "
        "cordoned node gets no new work; resurge cordons a node after a fatal GPU fault. "
        "'add', 'remove' and 'up' change the nodes of the local cluster that `resurge up` "
        "runs in the state folder (they ignore RESURGE_NATS_URL); `resurge up` without "
        "--nodes keeps them.",
    )
    node.set_defaults(run=run)
    node_commands = node.add_subparsers(dest="node_command", required=True)
    node_list = node_commands.add_parser(
        "list", help="every node: slots, free slots, health, cordon and why, jobs, labels"
    )
    node_list.add_argument("--json", action="store_true", help="print JSON")
    for verb, what in (
        ("cordon", "give it no new work"),
        (
            "uncordon",
            "let it take work again (the operator's word that it was repaired: on a local "
            "cluster its simulated GPUs are healthy again)",
        ),
    ):
        change = node_commands.add_parser(verb, help=f"{verb} a node: {what}")
        change.add_argument("name", help="node name, as `resurge node list` shows it")
    power = node_commands.add_parser(
        "up",
        help="power a local cluster's node on again after `resurge inject node-down`",
        description="Power a node of the local cluster in the state folder on again after "
        "`resurge inject node-down`: the supervisor starts its monitor, and the command "
        "returns once the node reports (or fails after --timeout seconds). A node lost "
        "under a job comes back cordoned, as any node fault leaves it: the command says "
        "so, and `resurge node uncordon NAME` lets it take work again.",
    )
    power.add_argument("name", help="node name, as `resurge node list` shows it")
    power.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the node to report (default 60)",
    )
    add = node_commands.add_parser(
        "add",
        help="add a virtual node to the local cluster; prints its name",
        description="Add a virtual node to the local cluster in the state folder. Prints "
        "its name (node-<i>, the next index not used before) once it has registered; "
        "fails, taking it out again, if it does not register within --timeout seconds.",
    )
    add.add_argument(
        "--gpus",
        type=positive,
        default=None,
        help="simulated GPUs (default: the cluster's GPUs per node)",
    )
    add.add_argument(
        "--label",
        dest="labels",
        type=label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a node label, e.g. topology.kubernetes.io/zone=a (repeatable; Kubernetes "
        "label rules for the key and value)",
    )
    add.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the node to register (default 60)",
    )
    remove = node_commands.add_parser(
        "remove",
        help="take a node out of the local cluster once no job runs on it",
        description="Take a node out of the local cluster in the state folder. It is "
        "cordoned first as being removed, so the scaler shrinks or moves the jobs on it; "
        "once no worker group is on it, its monitor stops and its record goes, and the "
        "command prints 'node NAME removed'. If worker groups are still on it after "
        "--timeout seconds, it fails naming their jobs and leaves the node cordoned.",
    )
    remove.add_argument("name", help="node name, as `resurge node list` shows it")
    remove.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for the jobs on it to leave (default 300)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the node subcommand; the exit status."""

    async def node(bus: Bus, local: bool) -> int:
        return await _node(bus, args, local=local)

    local_only = args.node_command in _LOCAL
    if args.node_command == "list":
        return on_bus(args, node)
    return on_bus(args, node, role="admin", local_only=local_only)


async def _node(bus: Bus, args: argparse.Namespace, *, local: bool) -> int:
    from resurge.cluster import open_backend
    from resurge.control.effects.nodes import bus_node_views, set_cordon
    from resurge.events import RepairNode

    if args.node_command in _LOCAL:
        return await _add_remove_or_power(bus, args)
    backend = await open_backend(bus, bus.settings)
    if args.node_command == "list":
        views = await bus_node_views(bus, backend)
        if args.json:
            print(json.dumps(views, indent=2))
            return 0
        _print_nodes(views, _powered_off(args) if local else set())
        return 0
    try:
        await set_cordon(bus, backend, args.name, cordoned=args.node_command == "cordon")
    except LookupError as error:
        print(f"resurge node {args.node_command}: {error}", file=sys.stderr)
        return 1
    if args.node_command == "uncordon":  # the operator's word that it was repaired
        await bus.publish(
            bus.subjects.node_cmd(args.name), RepairNode(source=bus.source, node=args.name)
        )
    print(f"node {args.name} {args.node_command}ed")
    return 0


def _powered_off(args: argparse.Namespace) -> set[str]:
    """The local cluster's nodes ``resurge inject node-down`` powered off."""
    from resurge.local.state import ClusterState, resolve_state_dir

    state = ClusterState.load(resolve_state_dir(args.state_dir))
    return set(state.down) if state is not None else set()


def _print_nodes(views: list[dict[str, object]], powered_off: set[str]) -> None:
    """``node list``'s lines: a node's slots, state (a powered-off one says so at once,
    before its heartbeat runs out), cordon, jobs and labels."""
    if not views:
        print("no nodes")
    for v in views:
        state = "cordoned" if v["cordoned"] else "ready" if v["healthy"] else "unhealthy"
        if not v["reporting"]:
            state = "not reporting"
        if v["name"] in powered_off:
            state = f"powered off (`resurge node up {v['name']}`)"
        why = f" ({v['cordonReason']})" if v["cordonReason"] else ""
        jobs = v["jobs"]
        names = ",".join(jobs) if isinstance(jobs, list) and jobs else "-"
        labels = v["labels"]
        tags = (
            "  labels: " + ",".join(f"{k}={value}" for k, value in sorted(labels.items()))
            if isinstance(labels, dict) and labels
            else ""
        )
        print(f"{v['name']:<16} {v['free']}/{v['slots']} free  {state}{why}  jobs: {names}{tags}")


async def _add_remove_or_power(bus: Bus, args: argparse.Namespace) -> int:
    """``node add`` / ``remove`` / ``up`` on the local cluster in the state folder."""
    from resurge.local.membership import MembershipError, add_node, power_on, remove_node
    from resurge.local.state import resolve_state_dir

    state_dir = resolve_state_dir(args.state_dir)
    try:
        if args.node_command == "add":
            name = await add_node(bus, state_dir, args.gpus, dict(args.labels), args.timeout)
            print(name)
        elif args.node_command == "up":
            powered = await power_on(bus, state_dir, args.name, args.timeout)
            print(f"node {args.name} {'powered on' if powered else 'is up already'}")
            print(await _cordon_hint(bus, args.name), end="")
        else:
            await remove_node(bus, state_dir, args.name, args.timeout)
            print(f"node {args.name} removed")
    except (LookupError, MembershipError) as error:
        print(f"resurge node {args.node_command}: {error.args[0]}", file=sys.stderr)
        return 1
    return 0


async def _cordon_hint(bus: Bus, name: str) -> str:
    """A line for a node that came back cordoned (resurge cordons a node lost under a
    job): powering it on is not the word that it is fit; empty if it is not cordoned."""
    from resurge.cluster import open_backend

    backend = await open_backend(bus, bus.settings)
    node = next((n for n in await backend.list_nodes() if n.name == name), None)
    if node is None or not node.cordoned:
        return ""
    why = f" ({node.cordon_reason})" if node.cordon_reason else ""
    return (
        f"it is cordoned{why}: `resurge node uncordon {name}` lets it take work again "
        "once it is fit\n"
    )
