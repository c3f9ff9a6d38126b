"""``resurge node``: list nodes, describe one (its faults across jobs, its score, its
quarantine), cordon or uncordon one (uncordon also ends its quarantine); add, remove or
power on one of the local cluster in the state folder (those three ignore
``RESURGE_NATS_URL``)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from resurge.cli.arguments import label, positive
from resurge.cli.connect import on_bus

if TYPE_CHECKING:
    from resurge.cluster import ClusterBackend
    from resurge.runtime.bus import Bus

__all__ = ["add_parser", "run"]

# The subcommands that change the local cluster's processes, not the bus's records.
_LOCAL = ("add", "remove", "up")


def add_parser(commands: Any) -> None:
    """Register ``node`` and its subcommands."""
    node = commands.add_parser(
        "node",
        help="list nodes, describe, cordon or uncordon one; add, remove or power on one of a "
        "local cluster",
        description="Nodes of the cluster: their slots, health, labels and cordons, and "
        "their fault scores across jobs. A cordoned node gets no new work; resurge cordons "
        "a node after a fatal GPU fault, and quarantines one whose score reaches "
        "RESURGE_NODE_QUARANTINE_SCORE (docs/nodes.md). "
        "'add', 'remove' and 'up' change the nodes of the local cluster that `resurge up` "
        "runs in the state folder (they ignore RESURGE_NATS_URL); `resurge up` without "
        "--nodes keeps them.",
    )
    node.set_defaults(run=run)
    node_commands = node.add_subparsers(dest="node_command", required=True)
    node_list = node_commands.add_parser(
        "list",
        help="every node: slots, free slots, health, cordon and why, jobs, score and "
        "quarantine, labels",
    )
    node_list.add_argument("--json", action="store_true", help="print JSON")
    describe = node_commands.add_parser(
        "describe",
        help="one node: its state, its fault score across jobs, its quarantine and the "
        "faults counted against it",
        description="One node: its slots, state, cordon and jobs as `resurge node list` "
        "shows them; its score (decayed to now) against the quarantine threshold; its "
        "quarantine (since when, why, the jobs moved off) and how the last one ended; and "
        "the faults counted against it across every job, newest first, each with the "
        "attribution rule that counted it (docs/nodes.md). The threshold, half-life and "
        "mode shown are those of this command's settings (RESURGE_NODE_QUARANTINE...).",
    )
    describe.add_argument("name", help="node name, as `resurge node list` shows it")
    describe.add_argument("--json", action="store_true", help="print JSON")
    for verb, what in (
        ("cordon", "give it no new work"),
        (
            "uncordon",
            "let it take work again (the operator's word that it was repaired: a "
            "quarantine ends, clearing its score; on a local cluster its simulated GPUs "
            "are healthy again)",
        ),
    ):
        change = node_commands.add_parser(verb, help=f"{verb} a node: {what}")
        change.add_argument("name", help="node name, as `resurge node list` shows it")
    drain = node_commands.add_parser(
        "drain",
        help="checkpoint the jobs on a node, then move them off it, and say what was done",
        description="Drain a node: the restarter cordons it, asks each job on it for a "
        "checkpoint and moves the job off once every rank saved it (a job whose workers "
        "do not run resurge.worker: at once; one whose checkpoint does not come within its "
        "elastic.checkpointTimeoutSeconds: from its newest complete one). Returns once "
        "every job is off the node, printing what was done for each; fails after "
        "--timeout seconds, printing how far it got. The node stays cordoned: `resurge "
        "node uncordon NAME` lets it take work again.",
    )
    drain.add_argument("name", help="node name, as `resurge node list` shows it")
    drain.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for the jobs to be off the node (default 300)",
    )
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
    if args.node_command in ("list", "describe"):
        return on_bus(args, node)
    return on_bus(args, node, role="admin", local_only=local_only)


async def _node(bus: Bus, args: argparse.Namespace, *, local: bool) -> int:
    from resurge.cluster import open_backend
    from resurge.control.effects.nodes import set_cordon
    from resurge.events import RepairNode

    if args.node_command in _LOCAL:
        return await _add_remove_or_power(bus, args)
    backend = await open_backend(bus, bus.settings)
    if args.node_command == "list":
        return await _list(bus, backend, args, local=local)
    if args.node_command == "describe":
        return await _describe(bus, backend, args, local=local)
    if args.node_command == "drain":
        return await _drain(bus, backend, args)
    try:
        await set_cordon(bus, backend, args.name, cordoned=args.node_command == "cordon")
    except LookupError as error:
        print(f"resurge node {args.node_command}: {error}", file=sys.stderr)
        return 1
    released = None
    if args.node_command == "uncordon":  # the operator's word that it was repaired
        await bus.publish(
            bus.subjects.node_cmd(args.name), RepairNode(source=bus.source, node=args.name)
        )
        released = await _release(bus, args.name)
    print(f"node {args.name} {args.node_command}ed")
    if released is not None:
        print(released)
    return 0


async def _list(bus: Bus, backend: ClusterBackend, args: argparse.Namespace, local: bool) -> int:
    """``node list``: each node's view with its score and quarantine."""
    from resurge.cli.node_words import list_line
    from resurge.control.decisions.node_score import NodePolicy
    from resurge.control.effects.nodes import bus_node_views
    from resurge.control.views.node_record import read_records, score_view

    views = await bus_node_views(bus, backend)
    records = await read_records(bus)
    now, policy = datetime.now(UTC), NodePolicy.of(bus.settings)
    views = [{**v, **score_view(records.get(str(v["name"])), now, policy)} for v in views]
    if args.json:
        print(json.dumps(views, indent=2))
        return 0
    if not views:
        print("no nodes")
    off = _powered_off(args) if local else set()
    for view in views:
        print(list_line(view, view["name"] in off))
    return 0


async def _describe(
    bus: Bus, backend: ClusterBackend, args: argparse.Namespace, local: bool
) -> int:
    """``node describe NAME``: exit status 1 for a node neither the cluster nor a health
    record knows."""
    from resurge.cli.node_words import describe_lines
    from resurge.control.decisions.node_score import NodePolicy
    from resurge.control.effects.nodes import bus_node_views
    from resurge.control.views.node_record import read_record, record_view

    views = await bus_node_views(bus, backend)
    node = next((v for v in views if v["name"] == args.name), None)
    record = await read_record(bus, args.name)
    if node is None and record is None:
        known = ", ".join(str(v["name"]) for v in views) or "none"
        print(
            f"resurge node describe: no node {args.name!r} in the cluster and no fault "
            f"record of one (nodes: {known})",
            file=sys.stderr,
        )
        return 1
    policy = NodePolicy.of(bus.settings)
    view = {
        **(node or {"name": args.name}),
        "inCluster": node is not None,
        **record_view(record, datetime.now(UTC), policy),
    }
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    print("\n".join(describe_lines(view, local and args.name in _powered_off(args))))
    return 0


async def _drain(bus: Bus, backend: ClusterBackend, args: argparse.Namespace) -> int:
    """``node drain NAME``: exit status 1 if the node is unknown or not drained in time."""
    from resurge.control.effects.node_drain import DrainTimeout, drain_node

    try:
        done = await drain_node(bus, backend, args.name, args.timeout)
    except LookupError as error:
        print(f"resurge node drain: {error}", file=sys.stderr)
        return 1
    except DrainTimeout as late:
        print(
            f"resurge node drain: {args.name} not drained within {args.timeout:g} s",
            file=sys.stderr,
        )
        for job, said in sorted((late.drain.jobs if late.drain else {}).items()):
            print(f"  job {job}: {said or 'still moving'}", file=sys.stderr)
        return 1
    print(f"node {args.name} drained (it stays cordoned)")
    if not done.jobs:
        print("  no job ran on it")
    for job, said in sorted(done.jobs.items()):
        print(f"  job {job}: {said}")
    return 0


async def _release(bus: Bus, name: str) -> str | None:
    """End node ``name``'s quarantine in its health record (the operator's word that it
    was repaired); a line saying so, or None where it was not quarantined."""
    from resurge.control.decisions.node_score import release
    from resurge.control.state.node_health import NodeHealthStore

    kv = await bus.node_health_bucket(create=False)
    if kv is None:
        return None
    now = datetime.now(UTC)
    before, after = await NodeHealthStore(kv).mutate(
        name, lambda r: release(r, now, "operator", "resurge node uncordon")
    )
    held = before.quarantine
    if held is None or after is before:
        return None
    what = "dry-run quarantine" if held.dry_run else "quarantine"
    return (
        f"node {name}'s {what} (since {held.since:%Y-%m-%d %H:%M:%S} UTC) released; its score is 0"
    )


def _powered_off(args: argparse.Namespace) -> set[str]:
    """The local cluster's nodes ``resurge inject node-down`` powered off."""
    from resurge.local.state import ClusterState, resolve_state_dir

    state = ClusterState.load(resolve_state_dir(args.state_dir))
    return set(state.down) if state is not None else set()


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
