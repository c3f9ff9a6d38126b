"""The ``resurge`` commands that talk to a running cluster over the bus."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from resurge.cli.events import show_events
from resurge.cli.report import write_report
from resurge.cli.status import show_status
from resurge.cluster import open_backend
from resurge.control.admission import cannot_hold
from resurge.control.client import (
    SubmitRefused,
    connected,
    delete_job,
    inject_fault,
    inject_xid,
    submit_job,
)
from resurge.control.nodes import node_views, set_cordon
from resurge.control.records import JobStore
from resurge.events import RepairNode
from resurge.jobspec import JobSpecError, TrainingJob, load_job
from resurge.local.checkpoints import forget_checkpoints
from resurge.local.membership import (
    MembershipError,
    add_node,
    power_off,
    power_on,
    remove_node,
)
from resurge.local.state import ClusterState, resolve_state_dir
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

__all__ = ["run_command"]


async def _node(bus: Bus, args: argparse.Namespace, *, local: bool) -> int:
    if args.node_command in ("add", "remove", "up"):
        return await _add_or_remove(bus, args)
    backend = await open_backend(bus, bus.settings)
    if args.node_command == "list":
        views = await node_views(backend)
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


async def _add_or_remove(bus: Bus, args: argparse.Namespace) -> int:
    """``node add`` / ``remove`` / ``up`` on the local cluster in the state folder."""
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


async def _delete(bus: Bus, args: argparse.Namespace, *, local: bool) -> int:
    """Delete the job; on a local cluster, also the checkpoints resurge chose a folder for
    (:mod:`resurge.local.checkpoints`)."""
    try:
        record = await delete_job(bus, args.job)
    except LookupError as error:
        print(f"resurge delete: {error.args[0]}", file=sys.stderr)
        return 1
    print(f"trainingjob {args.job} deleted")
    if local:
        done = forget_checkpoints(record, resolve_state_dir(args.state_dir))
        if done:
            print(done)
    return 0


async def run_command(args: argparse.Namespace, settings: Settings, *, local: bool) -> int:
    """Run one bus command; ``local``: the cluster runs on this machine (``resurge up``)."""
    command = args.command
    if command == "submit":
        return await _submit(args.file, settings, local=local)
    async with connected(settings) as bus:
        if command == "delete":
            return await _delete(bus, args, local=local)
        elif command == "status":
            return await show_status(bus, args)
        elif command == "inject":
            return await _inject(bus, args)
        elif command == "node":
            return await _node(bus, args, local=local)
        elif command == "events":
            return await show_events(bus, args)
        elif command == "report":
            return await write_report(bus, args)
    return 0


async def _submit(file: Path, settings: Settings, *, local: bool) -> int:
    try:
        job = load_job(file)
    except (JobSpecError, OSError) as error:
        print(f"resurge submit: {error}", file=sys.stderr)
        return 2
    if local and job.spec.working_dir is None:
        # On a local cluster a relative path in the command means "from here".
        job = job.model_copy(
            update={"spec": job.spec.model_copy(update={"working_dir": str(Path.cwd())})}
        )
    async with connected(settings) as bus:
        try:
            outcome = await submit_job(bus, job)
        except SubmitRefused as error:
            print(f"resurge submit: {error}", file=sys.stderr)
            return 1
        never = await _cannot_hold(bus, job) if outcome == "created" else None
    print(f"trainingjob {job.name} {'submitted' if outcome == 'created' else outcome}")
    if never is not None:
        print(f"resurge submit: warning: {job.name} stays Pending: {never}", file=sys.stderr)
    return 0


async def _cannot_hold(bus: Bus, job: TrainingJob) -> str | None:
    """Why no node of the cluster (every node it knows, reporting or not: a node powered
    off may come back) could hold ``job`` (:func:`cannot_hold`), or None; also None when
    the nodes cannot be read: the job is submitted all the same."""
    try:
        nodes = await (await open_backend(bus, bus.settings)).list_nodes()
    except Exception:  # a warning only: the status of the job says it too
        return None
    return cannot_hold(job, nodes, local=bus.settings.cluster == "local")


async def _cordon_hint(bus: Bus, name: str) -> str:
    """A line for a node that came back cordoned (resurge cordons a node lost under a
    job): powering it on is not the word that it is fit; empty if it is not cordoned."""
    backend = await open_backend(bus, bus.settings)
    node = next((n for n in await backend.list_nodes() if n.name == name), None)
    if node is None or not node.cordoned:
        return ""
    why = f" ({node.cordon_reason})" if node.cordon_reason else ""
    return (
        f"it is cordoned{why}: `resurge node uncordon {name}` lets it take work again "
        "once it is fit\n"
    )


async def _unwatched_hint(bus: Bus, job: str, rank: int) -> str:
    """A second line for an injected log line nothing will read: the job has no log
    rules, or none that watch ``rank``; empty otherwise."""
    found = await JobStore(await bus.jobs_bucket()).get(job)
    rules = [] if found is None else found[0].spec.spec.monitoring.log_rules
    if not rules:
        return (
            f"\nnote: nothing watches {job}'s logs (its spec has no monitoring.logRules), "
            "so this line is only printed: add a log rule to make one a fault or an alert"
        )
    if all(rule.ranks is not None and rank not in rule.ranks for rule in rules):
        return f"\nnote: none of {job}'s log rules watch rank {rank}, so this line is only printed"
    return ""


async def _inject(bus: Bus, args: argparse.Namespace) -> int:
    try:
        if args.fault == "node-down":
            cut = await power_off(resolve_state_dir(args.state_dir), args.node)
            done = (
                f"node {args.node} lost its power: its monitor, agents and workers were killed "
                f"and stay down until `resurge node up {args.node}`"
                if cut
                else f"node {args.node} is down already (`resurge node up {args.node}`)"
            )
        elif args.fault == "xid":
            what = await inject_xid(bus, args.node, args.gpu, args.code)
            done = f"injected XID {args.code} into GPU {args.gpu} of node {args.node} ({what})"
        else:
            where = await inject_fault(bus, args.job, args.rank, args.fault, args.line)
            done = f"injected {args.fault} into rank {args.rank} of {args.job} ({where})"
            if args.fault == "log":
                done += await _unwatched_hint(bus, args.job, args.rank)
    except (LookupError, MembershipError) as error:
        print(f"resurge inject: {error.args[0]}", file=sys.stderr)
        return 1
    print(done)
    return 0
