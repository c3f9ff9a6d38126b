"""``resurge report JOB [--uid UID] [--out DIR]``: a job's timeline as ``DIR/JOB.png``
and a self-contained ``DIR/JOB.html``, from the durable streams (so it works after the
job ended, for as long as the streams keep its events: a day by default, an hour for
steps). DIR defaults to ``reports/JOB/`` in the state folder, a folder per job. One run
of the job: the current one, the newest stored, or ``UID``'s (a job deleted and
submitted again under its name is a new run).

The picture (matplotlib, imported only here) has two panels sharing the time axis:
steps of rank 0, and world size; faults are red lines, recoveries shaded spans labelled
with their level and duration, resizes blue lines. The HTML page embeds the same
picture as SVG, a summary table (goodput, time lost by cause), the marks in words, and
the data behind the picture as JSON (``<script id="timeline-data">``). It loads nothing
from the network.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import sys
from pathlib import Path
from typing import Any

from resurge.control.state.records import JobStore
from resurge.control.views.job_overview import run_history
from resurge.control.views.runs import Run, job_runs
from resurge.control.views.timeline import Timeline, build_timeline
from resurge.runtime.bus import Bus

__all__ = ["render_html", "render_png", "write_report"]

_CAUSES = {
    "detection": "detecting faults",
    "restart": "restarts and resizes",
    "redone_steps": "steps trained again",
    "waiting_for_capacity": "waiting for capacity",
    "cluster_down": "cluster down",
}


def default_out(state_dir: Path, job: str) -> Path:
    """Where a report of ``job`` goes without ``--out``: a folder of its own."""
    return state_dir / "reports" / job


async def write_report(bus: Bus, args: argparse.Namespace) -> int:
    """Read ``args.job``'s history and write its two files; 0, or 1 if nothing is stored."""
    try:
        import matplotlib  # noqa: F401  (checked before any work)
    except ImportError:
        print("resurge report needs matplotlib: pip install 'resurge[report]'", file=sys.stderr)
        return 2
    run = await _run(bus, args.job, getattr(args, "uid", None))
    if isinstance(run, str):
        print(f"resurge report: {run}", file=sys.stderr)
        return 1
    timeline = build_timeline(args.job, await run_history(bus, args.job, run))
    if not timeline.phases and not timeline.steps:
        print(f"resurge report: no events of a job named {args.job!r} are stored", file=sys.stderr)
        return 1
    out = args.out
    if out is None:
        from resurge.local.state import resolve_state_dir

        out = default_out(resolve_state_dir(getattr(args, "state_dir", None)), args.job)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{args.job}.png"
    page = out / f"{args.job}.html"
    png.write_bytes(render_png(timeline))
    page.write_text(render_html(timeline))
    print(png)
    print(page)
    return 0


async def _run(bus: Bus, job: str, uid: str | None) -> Run | str | None:
    """The run to report: ``uid``'s, else the current record's, else the newest stored
    (None where the job stream keeps none of it); or why there is none."""
    if uid is None:
        found = await JobStore(await bus.jobs_bucket()).get(job)
        if found is not None:
            return Run(found[0].uid, found[0].submitted)
    runs = await job_runs(bus, job, uid)
    if uid is None:
        return runs[-1] if runs else None
    run = next((r for r in runs if r.uid == uid), None)
    if run is None:
        known = ", ".join(r.uid for r in runs) or "none"
        return f"no run {uid!r} of a job named {job!r} is stored; runs: {known}"
    return run


def _figure(timeline: Timeline) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (steps, world) = plt.subplots(
        2, 1, sharex=True, figsize=(10, 5.5), height_ratios=(3, 1), layout="constrained"
    )
    if timeline.steps:
        times, values = zip(*timeline.steps, strict=True)
        steps.plot(times, values, ".", markersize=2, color="#333333", label="step (rank 0)")
    steps.set_ylabel("step")
    end = timeline.summary.get("wall_seconds", 0.0)
    if timeline.world:
        times, sizes = zip(*[*timeline.world, (end, timeline.world[-1][1])], strict=True)
        world.step(times, sizes, where="post", color="#1f5fa8")
    world.set_ylabel("world size")
    world.yaxis.set_major_locator(MaxNLocator(integer=True))
    world.set_xlabel("seconds since the job's first event")
    for axes in (steps, world):
        for fault in timeline.faults:
            color = "#e0a000" if fault["alert"] else "#c62828"
            axes.axvline(fault["time"], color=color, linewidth=1)
        for recovery in timeline.recoveries:
            seconds = recovery["seconds"] or 0.0
            axes.axvspan(recovery["time"], recovery["time"] + seconds, color="#c62828", alpha=0.15)
        for resize in timeline.resizes:
            axes.axvline(resize["time"], color="#1f5fa8", linestyle="--", linewidth=1)
    top = max((s for _, s in timeline.steps), default=1)
    for recovery in timeline.recoveries:
        label = f"{recovery['level']} {recovery['seconds'] or 0:.2f}s"
        steps.annotate(label, (recovery["time"], top), rotation=90, va="top", fontsize=8)
    for resize in timeline.resizes:
        label = f"{resize['resize']} {resize['from']}->{resize['to']}"
        steps.annotate(label, (resize["time"], 0), rotation=90, va="bottom", fontsize=8)
    goodput = timeline.summary.get("goodput")
    shown = f", goodput {goodput:.1%}" if isinstance(goodput, float) else ""
    steps.set_title(f"{timeline.job}: {timeline.phase or 'no phase yet'}{shown}")
    return fig


def render_png(timeline: Timeline) -> bytes:
    """The timeline picture as PNG bytes."""
    return _render(timeline, "png")


def _render(timeline: Timeline, fmt: str) -> bytes:
    import matplotlib.pyplot as plt

    fig = _figure(timeline)
    out = io.BytesIO()
    fig.savefig(out, format=fmt, dpi=110)
    plt.close(fig)
    return out.getvalue()


def render_html(timeline: Timeline) -> str:
    """The self-contained page: the picture as inline SVG, the summary, the marks, the data."""
    svg = _render(timeline, "svg").decode()
    svg = svg[svg.index("<svg") :]  # inline: no XML prologue or doctype
    summary = timeline.summary
    lost = summary.get("lost_seconds", {})
    rows = [
        ("phase", summary.get("phase", "")),
        ("wall time", f"{summary.get('wall_seconds', 0):.1f} s"),
        ("productive time", f"{summary.get('productive_seconds', 0):.1f} s"),
        ("goodput", _percent(summary.get("goodput"))),
        *[(f"lost {words}", f"{lost.get(cause, 0):.2f} s") for cause, words in _CAUSES.items()],
        ("faults", summary.get("faults", 0)),
        ("recoveries by level", _levels(summary.get("recoveries_by_level", {}))),
        ("resizes", summary.get("resizes", 0)),
        ("final step", summary.get("final_step", 0)),
    ]
    table = "\n".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    marks = "\n".join(f"<li>{html.escape(line)}</li>" for line in _marks(timeline))
    data = json.dumps(timeline.as_dict()).replace("</", "<\\/")
    title = html.escape(f"resurge report: {timeline.job}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ text-align: left; padding: 0.2em 1em 0.2em 0; border-bottom: 1px solid #ddd; }}
svg {{ max-width: 100%; height: auto; }}
</style></head>
<body>
<h1>{title}</h1>
<p>From {html.escape(timeline.start)} to {html.escape(timeline.end)}.</p>
{svg}
<h2>Summary</h2>
<table>
{table}
</table>
<h2>What happened</h2>
<ul>
{marks}
</ul>
<script type="application/json" id="timeline-data">{data}</script>
</body></html>
"""


def _percent(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, float) else "-"


def _levels(counts: dict[str, int]) -> str:
    return ", ".join(f"{level} {n}" for level, n in sorted(counts.items())) or "none"


def _marks(timeline: Timeline) -> list[str]:
    lines: list[tuple[float, str]] = []
    for f in timeline.faults:
        where = " ".join(
            f"{k} {f[k]}" for k in ("rank", "node") if f[k] is not None
        )  # rank 3 node node-1
        kind = "alert" if f["alert"] else "fault"
        lines.append((f["time"], f"{kind} {f['reason']} ({where}): {f['message']}"))
    for r in timeline.recoveries:
        took = f" in {r['seconds']:.2f} s" if r["seconds"] is not None else " (unfinished)"
        lines.append((r["time"], f"recovery at {r['level']} level from {r['reason']}{took}"))
    for z in timeline.resizes:
        lines.append((z["time"], f"{z['resize']} {z['from']} -> {z['to']} replicas: {z['why']}"))
    for p in timeline.phases:
        lines.append((p["time"], f"phase {p['phase']}"))
    return [f"{t:8.2f} s  {text}" for t, text in sorted(lines, key=lambda item: item[0])]
