"""``resurge``: the user's command line (DESIGN section 7).

Commands that talk to a cluster use ``RESURGE_NATS_URL`` and ``RESURGE_NAMESPACE`` when
set, else the local cluster recorded in the state folder by ``resurge up``; with none
recorded there, or one whose supervisor or NATS server is gone, they fail at once, naming
the folder and how to point at a cluster. ``resurge node add`` and ``remove`` change the
local cluster's processes, so they always act on the state folder's cluster and ignore
``RESURGE_NATS_URL``; so do ``resurge node up`` and ``resurge inject node-down``, which
power a local node on and off. On a local cluster a command connects as the NATS user of its
role, from the folder's credentials: ``viewer`` to read (status, events, node list),
``admin`` to change (submit, delete, inject, node add/remove/cordon/uncordon); against
``RESURGE_NATS_URL`` it uses ``RESURGE_NATS_CREDENTIALS`` (or ``RESURGE_NATS_USER``
and ``RESURGE_NATS_PASSWORD``). A server that does not answer is reported after
:data:`CLI_CONNECT_SECONDS` (``RESURGE_CONNECT_TIMEOUT_SECONDS`` sets another limit).
``--state-dir`` goes before or after any subcommand
(:func:`_state_dir_everywhere` gives it to every subparser).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from resurge.cli.convert import add_convert_parser
from resurge.cli.report import add_report_parser
from resurge.cli.simulate import add_simulate_parser

if TYPE_CHECKING:
    from resurge.runtime.settings import Settings

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resurge",
        description=(
            "resurge keeps distributed PyTorch jobs alive: it detects faults and restarts "
            "what failed. Commands that talk to a cluster read RESURGE_NATS_URL and "
            "RESURGE_NAMESPACE, or else find the local cluster that `resurge up` started "
            "in the state folder."
        ),
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="local cluster folder (default: $RESURGE_STATE_DIR or ./.resurge)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a local cluster: NATS, the services, N nodes")
    up.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="virtual nodes (default: the nodes of this folder's earlier run, those added "
        "by `resurge node add` included, else 2); given, that many fresh nodes",
    )
    up.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="simulated GPUs per node (default 2; given, fresh nodes as with --nodes)",
    )
    up.add_argument("--port", type=int, default=0, help="NATS port (default: a free one)")
    up.add_argument(
        "--nats-cluster",
        type=_positive,
        default=1,
        metavar="N",
        help="run N NATS servers as one cluster (3 or 5; streams and buckets keep 3 copies, "
        "so one server may die without losing a message); default 1",
    )
    up.add_argument(
        "--foreground", action="store_true", help="stay attached; Ctrl-C stops the cluster"
    )
    commands.add_parser("down", help="stop the local cluster and everything it runs")
    submit = commands.add_parser("submit", help="submit a TrainingJob YAML file")
    submit.add_argument("file", type=Path)
    delete = commands.add_parser("delete", help="delete a job and stop its workers")
    delete.add_argument("job")
    status = commands.add_parser(
        "status",
        help="every job in a table (live on a terminal), or one job described",
        description="Without JOB: every job in a table (phase, generation, replicas, step "
        "and pace, restarts, last fault, last recovery, goodput, progress toward the final "
        "step when the job reports one), refreshed every second on a terminal until Ctrl-C "
        "(or until the cluster goes away: it says so and exits 1). "
        "With JOB: the job described (faults in words, recoveries, alerts, checkpoint, why "
        "a Pending job waits).",
    )
    status.add_argument("job", nargs="?", help="describe this job")
    status.add_argument("--json", action="store_true", help="print every field as JSON")
    status.add_argument(
        "--uid",
        metavar="UID",
        help="show this run of JOB (a job deleted and submitted again under its name is a "
        "new run; `--json` shows each run's uid), also one deleted since",
    )
    status.add_argument(
        "--once", action="store_true", help="print the table once, even on a terminal"
    )
    events = commands.add_parser(
        "events",
        help="print what happened, read back from the durable streams; --follow goes on",
        description="Print what happened to jobs and nodes, oldest first, one line per "
        "event, read back from the durable streams (raw telemetry is kept an hour, the "
        "rest a day): faults, recoveries, phases, resizes, process exits, checkpoints and "
        "progress every N steps. -v prints every event with all its fields, --json each "
        "event as stored.",
    )
    events.add_argument(
        "filter",
        nargs="?",
        default=None,
        help="only this subject filter under <namespace>.v1, e.g. 'fault.>' (every kind "
        "on it is shown)",
    )
    events.add_argument(
        "--job", help="only this job's events (one with no record and no stored event: exit 1)"
    )
    events.add_argument(
        "--since",
        type=_age,
        metavar="AGE",
        help="only events younger than AGE, e.g. 90s, 10m, 1h, 2d (default: all kept)",
    )
    events.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new events (Ctrl-C stops)"
    )
    events.add_argument(
        "-v", "--verbose", action="store_true", help="every event, with all its fields"
    )
    events.add_argument("--json", action="store_true", help="print each event as JSON")
    events.add_argument(
        "--every",
        type=_positive,
        default=100,
        metavar="N",
        help="show rank 0's progress every N steps (default 100)",
    )
    inject = commands.add_parser(
        "inject",
        help="break a worker or a simulated GPU on purpose",
        description="Break something on purpose. A worker (--job J --rank R): 'crash' "
        "(SIGKILL), 'hang' (SIGSTOP), 'log' (a fake output line; the command says so when "
        "none of the job's log rules watch it) or 'exception' (raised in "
        "its training function; workers under resurge.worker.restartable only). Or 'xid': "
        "an NVIDIA XID on a simulated GPU (--node N --gpu G --code C). Or 'node-down' "
        "(--node N): a power loss of a local cluster's node: its monitor, agents and "
        "workers are killed at once and stay down until `resurge node up N`.",
    )
    inject.add_argument(
        "fault",
        choices=["crash", "hang", "log", "exception", "xid", "node-down"],
        help="SIGKILL or SIGSTOP a worker, a fake log line, an exception in its training "
        "function, an XID on a simulated GPU, or a local node's power loss",
    )
    inject.add_argument("--job", help="crash|hang|log|exception: job name")
    inject.add_argument(
        "--rank", type=_count, help="crash|hang|log|exception: global rank of the worker"
    )
    inject.add_argument("--line", default="", help="log: the line the worker 'prints'")
    inject.add_argument("--node", help="xid: node whose GPU raises it; node-down: the node")
    inject.add_argument("--gpu", type=_count, help="xid: GPU index on the node")
    inject.add_argument("--code", type=_count, help="xid: the XID code, e.g. 79")
    inject.set_defaults(inject_parser=inject)
    commands.add_parser(
        "demo",
        help="the whole story: up, a DDP job, a worker killed and recovered, a summary, down",
        description="The whole story in one command: a local cluster (2 nodes x 2 simulated "
        "GPUs), the DDP example, one worker killed and the job recovered, a summary, then "
        "everything stopped. It runs in a temporary state folder (removed if it passes), "
        "or in --state-dir DIR, which is kept; a folder where a cluster runs is refused.",
    )
    node = commands.add_parser(
        "node",
        help="list nodes, cordon or uncordon one; add, remove or power on one of a local cluster",
        description="Nodes of the cluster: their slots, health, labels and cordons. A "
        "cordoned node gets no new work; resurge cordons a node after a fatal GPU fault. "
        "'add', 'remove' and 'up' change the nodes of the local cluster that `resurge up` "
        "runs in the state folder (they ignore RESURGE_NATS_URL); `resurge up` without "
        "--nodes keeps them.",
    )
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
        type=_positive,
        default=None,
        help="simulated GPUs (default: the cluster's GPUs per node)",
    )
    add.add_argument(
        "--label",
        dest="labels",
        type=_label,
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
    schema = commands.add_parser(
        "schema",
        help="print the JSON Schema of every event kind, or write them, or the TrainingJob CRD",
    )
    schema.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write each schema to DIR/NAME.schema.json instead of printing them all as one "
        "JSON document ({name: schema}) on stdout",
    )
    schema.add_argument(
        "--crd",
        type=Path,
        metavar="FILE",
        help="write the TrainingJob CustomResourceDefinition (YAML) to FILE ('-': stdout)",
    )
    add_report_parser(commands)
    _state_dir_everywhere(parser)
    add_convert_parser(commands)  # after: convert and simulate need no state folder
    add_simulate_parser(commands)
    _describe_subcommands(parser)
    return parser


def _describe_subcommands(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description its one-line help as one, so that
    ``resurge CMD --help`` says what CMD does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                if not sub.description and choice.help:
                    sub.description = choice.help[:1].upper() + choice.help[1:] + "."
                _describe_subcommands(sub)


def _state_dir_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept ``--state-dir`` after any subcommand too (DESIGN section 7); given there, it
    wins over one given before the subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument(
                    "--state-dir",
                    type=Path,
                    default=argparse.SUPPRESS,
                    help="local cluster folder (default: $RESURGE_STATE_DIR or ./.resurge)",
                )
                _state_dir_everywhere(sub)


def _count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0")
    return value


# What each kind of `resurge inject` needs and takes: a worker fault, or an XID on a GPU.
_INJECT_NEEDS = {
    "worker": ("job", "rank"),
    "xid": ("node", "gpu", "code"),
    "node-down": ("node",),
}
_INJECT_TAKES = {
    "worker": {"job", "rank", "line"},
    "xid": {"node", "gpu", "code"},
    "node-down": {"node"},
}


def _check_inject(args: argparse.Namespace) -> None:
    """Fail, naming the options, where ``inject``'s fault lacks some or got others."""
    kind = args.fault if args.fault in ("xid", "node-down") else "worker"
    missing = [f"--{name}" for name in _INJECT_NEEDS[kind] if getattr(args, name) is None]
    stray = [
        f"--{name}"
        for name in ("job", "rank", "line", "node", "gpu", "code")
        if name not in _INJECT_TAKES[kind] and getattr(args, name) not in (None, "")
    ]
    parser: argparse.ArgumentParser = args.inject_parser
    if args.fault == "log" and not args.line:
        missing.append("--line")
    if missing:
        needs = " ".join(f"--{name}" for name in _INJECT_NEEDS[kind])
        needs += " --line" if args.fault == "log" else ""
        parser.error(f"inject {args.fault} needs {needs}; missing {', '.join(missing)}")
    if stray:
        parser.error(f"inject {args.fault} does not take {', '.join(stray)}")


def _age(text: str) -> float:
    """An argparse type: an age such as ``90s``, ``10m``, ``1h`` or ``2d``, in seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = text[:-1], text[-1:]
    if unit not in units:
        number, unit = text, "s"
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age such as 90s, 10m, 1h or 2d"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0")
    return value


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def _label(text: str) -> tuple[str, str]:
    """An argparse type: a ``key=value`` node label."""
    from resurge.control.nodes import parse_label

    try:
        return parse_label(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# Commands (and `node` subcommands) that change the cluster: on a local cluster they
# connect as its admin user, every other command as its viewer (docs/security.md).
ADMIN_COMMANDS = frozenset(
    {"submit", "delete", "inject", "add", "remove", "up", "cordon", "uncordon"}
)


class NoClusterError(Exception):
    """No cluster to talk to: the message says where resurge looked and what to do."""


def _settings(
    state_dir: Path | None, local_only: bool = False, role: str = "viewer"
) -> tuple[Settings, bool]:
    """Settings for the cluster to talk to, and whether it is a local one.

    With ``RESURGE_NATS_URL`` set (and not ``local_only``), that server; else the local
    cluster recorded in the state folder, which must be running (:class:`NoClusterError`
    at once otherwise), as ``role``'s NATS user from the folder's credentials."""
    from resurge.local.state import (
        ClusterState,
        StateLock,
        credentials_path,
        resolve_state_dir,
    )
    from resurge.runtime.settings import Settings

    if "RESURGE_NATS_URL" in os.environ and not local_only:
        return _briefly(Settings()), False
    folder = resolve_state_dir(state_dir)
    how = (
        "start one there with `resurge up`, point at another with --state-dir DIR or "
        "RESURGE_STATE_DIR, or at a NATS server with RESURGE_NATS_URL"
    )
    state = ClusterState.load(folder)
    if state is None:
        raise NoClusterError(f"no local cluster found in {folder}: {how}")
    elsewhere = how.split(", ", 1)[1]
    if not StateLock(folder).held_elsewhere():
        raise NoClusterError(
            f"the local cluster recorded in {folder} is not running (its supervisor, pid "
            f"{state.pid}, is gone): `resurge up` starts it again; or {elsewhere}"
        )
    if not state.nats_answers():
        raise NoClusterError(
            f"the local cluster recorded in {folder} is broken: its supervisor (pid "
            f"{state.pid}) runs but its NATS server at {state.nats_url} does not answer (see "
            f"{folder / 'logs'}): `resurge down` then `resurge up` starts it again; or "
            f"{elsewhere}"
        )
    credentials = credentials_path(folder, role)
    settings = Settings(
        nats_url=state.nats_url,
        namespace=state.namespace,
        nats_credentials=credentials if credentials.exists() else None,
        nats_tls_ca=Path(state.tls_ca) if state.tls_ca else None,
    )
    return _briefly(settings), True


# A person waits on the command: a server that does not answer in this long is reported
# (a service waits longer, RESURGE_CONNECT_TIMEOUT_SECONDS, for a server starting up).
CLI_CONNECT_SECONDS = 5.0


def _briefly(settings: Settings) -> Settings:
    """``settings`` that give up on an unreachable server after
    :data:`CLI_CONNECT_SECONDS`, unless RESURGE_CONNECT_TIMEOUT_SECONDS says otherwise."""
    if "RESURGE_CONNECT_TIMEOUT_SECONDS" in os.environ:
        return settings
    return settings.model_copy(update={"connect_timeout_seconds": CLI_CONNECT_SECONDS})


def main(argv: list[str] | None = None) -> int:
    """Run one ``resurge`` command from ``argv`` (default ``sys.argv[1:]``); its exit status.

    Output piped into a reader that stops early (``| head``) ends the command quietly."""
    try:
        return _main(argv)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's own flush cannot fail
        return 0


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "inject":
        _check_inject(args)
    if args.command in ("up", "down"):
        from resurge.local.state import resolve_state_dir
        from resurge.local.updown import down, up

        state_dir = resolve_state_dir(args.state_dir)
        if args.command == "down":
            return down(state_dir)
        return up(
            state_dir,
            args.nodes,
            args.gpus_per_node,
            args.port,
            args.foreground,
            args.nats_cluster,
        )
    if args.command == "demo":
        from resurge.local.demo import run_demo

        return run_demo(args.state_dir)
    if args.command in ("convert", "simulate"):
        return _without_cluster(args)
    if args.command == "schema":
        from resurge.cli.schemas import run_schema

        return run_schema(args.out, args.crd)
    return _on_cluster(args)


def _without_cluster(args: argparse.Namespace) -> int:
    """The commands that need no cluster and no state folder: convert, simulate."""
    if args.command == "convert":
        from resurge.cli.convert import run_convert

        return run_convert(args)
    from resurge.cli.simulate import run_simulate

    return run_simulate(args)


def _on_cluster(args: argparse.Namespace) -> int:
    import nats.errors

    from resurge.cli.cluster_commands import run_command

    if args.command == "submit":  # a bad spec is an error before any cluster is looked for
        from resurge.jobspec import JobSpecError, load_job

        try:
            load_job(args.file)
        except (JobSpecError, OSError) as error:
            print(f"resurge submit: {error}", file=sys.stderr)
            return 2
    # The bus's reconnect warnings are for services' logs; the CLI says what failed itself.
    logging.getLogger("resurge.runtime.bus").setLevel(logging.ERROR)
    local = False
    try:
        local_only = (args.command == "node" and args.node_command in ("add", "remove", "up")) or (
            args.command == "inject" and args.fault == "node-down"
        )
        command = args.node_command if args.command == "node" else args.command
        role = "admin" if command in ADMIN_COMMANDS else "viewer"
        settings, local = _settings(args.state_dir, local_only, role)
        return asyncio.run(run_command(args, settings, local=local))
    except NoClusterError as error:
        print(f"resurge {args.command}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the output's reader went away: not a NATS connection error
        raise
    except ConnectionError as error:
        where = "" if local else " (RESURGE_NATS_URL)"
        print(f"resurge {args.command}: {error}{where}", file=sys.stderr)
        return 2
    except nats.errors.Error as error:  # the server went away mid-command (`resurge down`)
        print(
            f"resurge {args.command}: the cluster stopped answering ({error}); is it running?",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
