"""``resurge status [JOB] [--json] [--watch]``: the jobs as a table, one job described.

- Without JOB: a table of every job (phase, generation, replicas, step and pace,
  restarts, last fault, last recovery, goodput, a progress bar toward the final step
  when the job reports one). On a terminal it refreshes every second until Ctrl-C, or
  until the cluster goes away (its NATS connection lost for :data:`GONE_SECONDS`: it
  says so and exits 1); ``--once`` prints it once; piped, it prints once as plain text.
- With JOB: a ``kubectl describe``-like view: the record's fields, the last faults in
  words (rank, node, evidence), recent recoveries with level and duration, the newest
  checkpoint, where the latest generation's registered state came from (memory, peers,
  the disk checkpoint), the last resize, alerts, and why a Pending job waits.
- ``--json``: every field, for scripts (DESIGN section 7's object, plus the overview).
- A job deleted and submitted again under its name is a new run: status shows the
  current run only. ``--uid UID`` shows the run ``UID`` (``uid`` in ``--json``), also
  one deleted since, from what the streams keep of it.

rich draws the table and the live refresh.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from typing import Any

import nats.errors
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from resurge.control.effects.client import job_status
from resurge.control.views.job_overview import overview, past_run_view, run_history
from resurge.control.views.runs import Run, job_runs
from resurge.runtime.bus import Bus

__all__ = ["describe", "jobs_table", "show_status"]

REFRESH_SECONDS = 1.0
GONE_SECONDS = 5.0
"""How long the live table waits for a lost NATS connection to come back before it
says the cluster went away and stops."""
BAR_WIDTH = 40
EVIDENCE_CHARS = 40


async def _views(bus: Bus, job: str | None) -> list[dict[str, Any]]:
    """The status objects of ``job`` (or of every job), each with its overview of its
    own run: nothing of an earlier run of the same name."""
    views: list[dict[str, Any]] = await job_status(bus, job)
    for view in views:
        run = Run(str(view["uid"]), datetime.fromisoformat(str(view["submitted"])))
        view.update((await overview(bus, str(view["name"]), run)).as_json())
    return views


async def _run_view(bus: Bus, job: str, uid: str) -> dict[str, Any] | str:
    """The status object of run ``uid`` of ``job`` (its record if it is the current
    run, else its events), or why there is none."""
    current = [v for v in await _views(bus, job) if v["uid"] == uid]
    if current:
        return current[0]
    runs = await job_runs(bus, job, uid)
    run = next((r for r in runs if r.uid == uid), None)
    if run is None:
        known = ", ".join(f"{r.uid} (submitted {r.submitted:%Y-%m-%d %H:%M:%S})" for r in runs)
        return f"no run {uid!r} of a job named {job!r} is stored; runs: {known or 'none'}"
    return past_run_view(job, run, await run_history(bus, job, run))


def _restarts(view: dict[str, Any]) -> str:
    counts = view.get("restarts") or {}
    return ",".join(f"{level}:{n}" for level, n in counts.items()) or "0"


def _step(view: dict[str, Any]) -> str:
    step, final, pace = view.get("step"), view.get("finalStep"), view.get("stepsPerSecond")
    if step is None:
        return "-"
    shown = f"{step}/{final}" if final else str(step)
    return f"{shown} {pace:.1f}/s" if pace else shown


def _step_of(view: dict[str, Any]) -> str:
    step, final = view.get("step"), view.get("finalStep")
    if step is None:
        return "-"
    return f"{step}/{final}" if final else str(step)


def _goodput(view: dict[str, Any]) -> str:
    goodput = view.get("goodput")
    return f"{goodput:.0%}" if isinstance(goodput, float) else "-"


def jobs_table(views: list[dict[str, Any]]) -> Group | Text:
    """Every job in one table; under it, per job, a progress bar toward the final step
    when the job reports one, and its last fault and recovery (or "no jobs")."""
    if not views:
        return Text("no jobs")
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("JOB", no_wrap=True, max_width=24, overflow="ellipsis")
    for column in ("PHASE", "GEN", "REPL", "STEP"):
        table.add_column(column, no_wrap=True)
    for column in ("STEP/S", "RESTARTS", "GOODPUT"):
        table.add_column(column, justify="right", no_wrap=True)
    below: list[Table | Text] = []
    width = max(len(str(view["name"])) for view in views)
    for view in views:
        replicas = view.get("replicas") or {}
        pace = view.get("stepsPerSecond")
        table.add_row(
            str(view["name"]),
            str(view["phase"]),
            str(view["generation"]),
            f"{replicas.get('current', 0)}/{replicas.get('target', 0)}",
            _step_of(view),
            f"{pace:.1f}" if pace else "-",
            str(sum((view.get("restarts") or {}).values())),
            _goodput(view),
        )
        final, step = view.get("finalStep"), view.get("step")
        if final and step is not None:
            done = min(step, final)
            line = Table.grid(padding=(0, 1))
            line.add_row(
                str(view["name"]).ljust(width),
                ProgressBar(total=float(final), completed=float(done), width=BAR_WIDTH),
                f"{done / final:.0%}",
            )
            below.append(line)
        last = _last_words(view)
        if last:
            below.append(Text(f"{'':{width}} {last}"))
    return Group(table, Text(""), *below) if below else Group(table)


def _last_words(view: dict[str, Any]) -> str:
    fault, recovery = view.get("lastFault"), view.get("lastRecovery")
    said = [why for why in (_waiting_words(view),) if why]
    if isinstance(fault, dict):
        said.append(f"fault {fault['reason']} {str(fault['time'])[11:19]}")
    if isinstance(recovery, dict):
        said.append(f"recovered at {recovery['level']} in {recovery['seconds']:.2f} s")
    return ", ".join(said)


def describe(view: dict[str, Any]) -> Group:
    """One job, as ``kubectl describe`` shows an object."""
    lines: list[Text | Table] = []
    fields = Table.grid(padding=(0, 2))
    replicas = view.get("replicas") or {}
    for name, value in (
        ("Name", view["name"]),
        ("Uid", view.get("uid") or "-"),
        ("Phase", view["phase"]),
        ("Message", view.get("message") or "-"),
        ("Generation", view["generation"]),
        ("Replicas", f"{replicas.get('current', 0)} current, {replicas.get('target', 0)} target"),
        ("Last resize", _resize_words(view.get("lastResize"))),
        ("Step", _step(view)),
        ("Restarts", _restarts(view)),
        ("Goodput", _goodput(view)),
        ("Time lost", _lost(view)),
        ("Checkpoint", _checkpoint(view)),
        ("Resumed", _restored_words(view.get("restored"))),
    ):
        fields.add_row(f"{name}:", str(value))
    lines.append(fields)
    waiting = _waiting_words(view)
    if waiting:
        lines.append(Text(f"Waiting: {waiting}"))
    lines.append(_section("Faults", [_fault_words(f) for f in view.get("recentFaults", [])]))
    lines.append(
        _section("Recoveries", [_recovery_words(r) for r in view.get("recentRecoveries", [])])
    )
    lines.append(_section("Alerts", [_fault_words(a) for a in view.get("alerts", [])]))
    return Group(*lines)


def _waiting_words(view: dict[str, Any]) -> str:
    """Why a Pending job waits, or why a grow waits and until when; else nothing."""
    if view["phase"] == "Pending":
        return str(view.get("message") or "for room on the nodes")
    held = view.get("heldGrow")
    if isinstance(held, dict):
        return f"grow to {held['to']} waits for {held['why']} until {str(held['until'])[11:19]}"
    return ""


def _resize_words(resize: object) -> str:
    """The last resize in a line: what, from and to, when, how long, why."""
    if not isinstance(resize, dict):
        return "none"
    took = resize.get("seconds")
    pause = f", {took:.2f} s to the first step at the new size" if took is not None else ""
    return (
        f"{resize['resize']} {resize['from']} -> {resize['to']} replicas at "
        f"{str(resize['time'])[11:19]}{pause}: {resize['why']}"
    )


def _section(title: str, items: list[str]) -> Text:
    body = "\n".join(f"  {item}" for item in items) or "  none"
    return Text(f"{title}:\n{body}")


def _lost(view: dict[str, Any]) -> str:
    lost = view.get("lostSeconds") or {}
    shown = [
        f"{cause.replace('_', ' ')} {seconds:.1f}s" for cause, seconds in lost.items() if seconds
    ]
    return ", ".join(shown) or "none"


def _checkpoint(view: dict[str, Any]) -> str:
    newest = view.get("newestCheckpoint") or view.get("latestCheckpoint")
    return f"step {newest['step']} at {newest['path']}" if isinstance(newest, dict) else "none"


_SOURCE_WORDS = {
    "memory": "memory",
    "peer": "peers",
    "disk": "the disk checkpoint",
    "start": "a fresh start",
}


def _restored_words(restored: object) -> str:
    """Where the latest generation's state came from, in a line: the step, each source
    with its ranks, the generation, and why where it fell back to the disk or started
    fresh."""
    if not isinstance(restored, dict):
        return "none"
    sources: dict[str, int] = restored.get("sources") or {}
    parts = [
        f"{_SOURCE_WORDS.get(source, source)} ({n} rank{'' if n == 1 else 's'})"
        for source, n in sources.items()
    ]
    said = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
    step = restored.get("step")
    text = f"step {step} from {said}" if step is not None else said or "nothing reported"
    text += f", generation {restored['generation']}"
    fell_back = "disk" in sources or "start" in sources
    return text + (f": {restored['detail']}" if fell_back and restored.get("detail") else "")


def _fault_words(fault: dict[str, Any]) -> str:
    where = ", ".join(f"{k} {fault[k]}" for k in ("rank", "node") if fault.get(k) is not None)
    evidence = ", ".join(  # short facts only: a traceback belongs to `resurge events -v`
        f"{k}={v}"
        for k, v in (fault.get("evidence") or {}).items()
        if len(str(v)) <= EVIDENCE_CHARS and "\n" not in str(v)
    )
    text = f"{fault['time'][11:19]} {fault['reason']}"
    text += f" ({where})" if where else ""
    text += f": {fault['message']}" if fault.get("message") else ""
    return text + (f" [{evidence}]" if evidence else "")


def _recovery_words(recovery: dict[str, Any]) -> str:
    return (
        f"{recovery['time'][11:19]} {recovery['level']} level, from {recovery['reason']}, "
        f"in {recovery['seconds']:.2f} s"
    )


async def show_status(bus: Bus, args: argparse.Namespace) -> int:
    """Print the status ``args`` asks for; 1 for an unknown JOB (or run)."""
    if getattr(args, "uid", None):
        if not args.job:
            print("resurge status: --uid needs a JOB", file=sys.stderr)
            return 2
        found = await _run_view(bus, args.job, args.uid)
        if isinstance(found, str):
            print(f"resurge status: {found}", file=sys.stderr)
            return 1
        views = [found]
    else:
        views = await _views(bus, args.job)
    if args.job and not views:
        print(f"resurge status: no job named {args.job!r}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(views[0] if args.job else views, indent=2))
        return 0
    console = Console()
    if args.job:
        console.print(describe(views[0]))
        return 0
    if args.once or not console.is_terminal:
        console.print(jobs_table(views))
        return 0
    return await _live(bus, console, views)


async def _live(bus: Bus, console: Console, views: list[dict[str, Any]]) -> int:
    """The table, refreshed every second until Ctrl-C; 1, saying so, once the cluster
    went away."""
    try:
        with Live(jobs_table(views), console=console, auto_refresh=False) as live:
            while True:
                await asyncio.sleep(REFRESH_SECONDS)
                fresh = await _refreshed(bus)
                if fresh is not None:
                    live.update(jobs_table(fresh), refresh=True)
    except ClusterGone as gone:
        print(f"resurge status: {gone}", file=sys.stderr)
        return 1


class ClusterGone(Exception):
    """The cluster's NATS server stopped answering and did not come back."""


async def _refreshed(bus: Bus) -> list[dict[str, Any]] | None:
    """Every job's view again; None where a read failed on a connection that is still up
    (the table stays as it was). :class:`ClusterGone` once the connection is lost and
    not back within :data:`GONE_SECONDS` (a server the supervisor restarts is back
    sooner), so nothing is read from a cluster half shut down."""
    await _still_there(bus)
    try:
        return await _views(bus, None)
    except (nats.errors.Error, TimeoutError, ConnectionError, OSError):
        await _still_there(bus)
        return None


async def _still_there(bus: Bus) -> None:
    deadline = asyncio.get_running_loop().time() + GONE_SECONDS
    while not bus.connected:
        if bus.nc.is_closed or asyncio.get_running_loop().time() > deadline:
            raise ClusterGone(
                f"the cluster went away: its NATS server at {bus.settings.nats_url} stopped "
                f"answering (for {GONE_SECONDS:g} s); stopped watching"
            )
        await asyncio.sleep(0.1)  # the client reconnects by itself: polled, bounded
