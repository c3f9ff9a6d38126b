"""``resurge inject FAULT``: break a worker, a simulated GPU or a local node on purpose."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from resurge.cli.arguments import count
from resurge.cli.connect import on_bus

if TYPE_CHECKING:
    from resurge.runtime.bus import Bus

__all__ = ["add_parser", "run"]

# What each kind of `resurge inject` needs and takes: a worker fault, or an XID on a GPU.
_NEEDS = {
    "worker": ("job", "rank"),
    "xid": ("node", "gpu", "code"),
    "gpu-warning": ("node", "gpu", "sign"),
    "node-down": ("node",),
}
_TAKES = {
    "worker": {"job", "rank", "line"},
    "xid": {"node", "gpu", "code"},
    "gpu-warning": {"node", "gpu", "sign"},
    "node-down": {"node"},
}


def add_parser(commands: Any) -> None:
    """Register ``inject``."""
    inject = commands.add_parser(
        "inject",
        help="break a worker or a simulated GPU on purpose",
        description="Break something on purpose. A worker (--job J --rank R): 'crash' "
        "(SIGKILL), 'hang' (SIGSTOP), 'log' (a fake output line; the command says so when "
        "none of the job's log rules watch it) or 'exception' (raised in "
        "its training function; workers under resurge.worker.restartable only). Or 'xid': "
        "an NVIDIA XID on a simulated GPU (--node N --gpu G --code C). Or 'gpu-warning': "
        "a warning sign in a simulated GPU's readings from now on (--node N --gpu G --sign "
        "corrected-ecc|retired-pages|thermal: its corrected ECC count rising, its retired "
        "pages growing, thermal throttling), until `resurge node uncordon`. Or 'node-down' "
        "(--node N): a power loss of a local cluster's node: its monitor, agents and "
        "workers are killed at once and stay down until `resurge node up N`.",
    )
    inject.add_argument(
        "fault",
        choices=["crash", "hang", "log", "exception", "xid", "gpu-warning", "node-down"],
        help="SIGKILL or SIGSTOP a worker, a fake log line, an exception in its training "
        "function, an XID or a warning sign on a simulated GPU, or a local node's power loss",
    )
    inject.add_argument("--job", help="crash|hang|log|exception: job name")
    inject.add_argument(
        "--rank", type=count, help="crash|hang|log|exception: global rank of the worker"
    )
    inject.add_argument("--line", default="", help="log: the line the worker 'prints'")
    inject.add_argument(
        "--node", help="xid|gpu-warning: node whose GPU shows it; node-down: the node"
    )
    inject.add_argument("--gpu", type=count, help="xid|gpu-warning: GPU index on the node")
    inject.add_argument("--code", type=count, help="xid: the XID code, e.g. 79")
    inject.add_argument(
        "--sign",
        choices=["corrected-ecc", "retired-pages", "thermal"],
        help="gpu-warning: the warning sign the GPU's readings show",
    )
    inject.set_defaults(run=run, inject_parser=inject)


def run(args: argparse.Namespace) -> int:
    """Check the options, then inject; the exit status."""
    _check(args)

    async def inject(bus: Bus, _local: bool) -> int:
        return await _inject(bus, args)

    return on_bus(args, inject, role="admin", local_only=args.fault == "node-down")


def _check(args: argparse.Namespace) -> None:
    """Fail, naming the options, where the fault lacks some or got others."""
    kind = args.fault if args.fault in ("xid", "gpu-warning", "node-down") else "worker"
    missing = [f"--{name}" for name in _NEEDS[kind] if getattr(args, name) is None]
    stray = [
        f"--{name}"
        for name in ("job", "rank", "line", "node", "gpu", "code", "sign")
        if name not in _TAKES[kind] and getattr(args, name) not in (None, "")
    ]
    parser: argparse.ArgumentParser = args.inject_parser
    if args.fault == "log" and not args.line:
        missing.append("--line")
    if missing:
        needs = " ".join(f"--{name}" for name in _NEEDS[kind])
        needs += " --line" if args.fault == "log" else ""
        parser.error(f"inject {args.fault} needs {needs}; missing {', '.join(missing)}")
    if stray:
        parser.error(f"inject {args.fault} does not take {', '.join(stray)}")


async def _inject(bus: Bus, args: argparse.Namespace) -> int:
    from resurge.control.effects.client import inject_fault, inject_gpu_warning, inject_xid
    from resurge.local.membership import MembershipError, power_off
    from resurge.local.state import resolve_state_dir

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
        elif args.fault == "gpu-warning":
            what = await inject_gpu_warning(bus, args.node, args.gpu, args.sign)
            done = f"injected warning sign {args.sign} into GPU {args.gpu} of node {args.node} "
            done += f"({what})"
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


async def _unwatched_hint(bus: Bus, job: str, rank: int) -> str:
    """A second line for an injected log line nothing will read: the job has no log
    rules, or none that watch ``rank``; empty otherwise."""
    from resurge.control.state.records import JobStore

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
