"""Control-plane latency against scale, as curves: three latencies at 256 to 16,384 replicas.

Each point runs on a NATS of its own (1 server, or a cluster of 3 whose streams and
buckets keep 3 copies, as ``resurge up --nats-cluster 3`` makes it), with real resurge
services as processes and simulated agents, many to a process, ``--per-node`` replicas
to a node (one worker each):

- ``fanout``: a process fault -> the last replica holds its new Assign (a real
  restarter; bench/scale_fanout.py, as bench/fanout.py at one size);
- ``detection``: a rank gone silent -> the detector's hang fault, less the 2 s
  heartbeat timeout, while every rank sends a Progress a second and every node a GPU
  sample and a node report a second (a real detector; bench/scale_detection.py, as
  bench/detector_throughput.py measures hang latency);
- ``resize``: a real scaler's decision to grow the job by one node -> the last
  replica's first step at the new size (a real scaler and restarter; the simulated
  agents answer the warm-up, the checkpoint and the Assign at once, so this is the
  control plane alone, no worker start or rendezvous; bench/scale_resize.py).

Each point: p50 and p99 over its rounds (``--rounds``; ``--resize-rounds`` for the
resize, whose rounds wait for the scaler's settle time), and each as a multiple of the
idle baselines measured on the same NATS just before (one JetStream hop; one round
trip between two idle processes, bench/scale_nats.py), since this machine is noisy.
A size the bench does not reach in reasonable time (the point before it, times the
size ratio, over ``--point-budget`` seconds; or one that failed) is not run, and is
extrapolated from the two largest measured sizes (a power law,
bench/scale_fit.py), marked so in the CSV and the plot; a size that failed, and those
above it, are not (the CSV's header says why it failed). Written: one CSV and one PNG
per curve in ``--out`` (default docs/scale), the command that made them in the CSV's
header; ``--merge`` keeps the points there that this run does not measure again (a
size measured on its own, say), under the lines of the run that made them. A
benchmark: it prints, it does not assert.

    .venv/bin/python bench/scale_curves.py [--quick] [--sizes 256,1024,4096,16384]
        [--nats 1,3] [--curves fanout,detection,resize] [--rounds 5] [--resize-rounds 2]
        [--point-budget 300] [--out docs/scale] [--merge]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from idle_baselines import idle_round_trip_seconds, one_hop_seconds
from scale_detection import HEARTBEAT_TIMEOUT, measure_detection
from scale_fanout import measure_fanout
from scale_fit import Point, csv_text, extrapolate, parse_csv, point_of
from scale_nats import Nats, nats_of
from scale_resize import measure_resize

SIZES = (256, 1024, 4096, 16384)
QUICK_SIZES = (256, 1024)


@dataclass(frozen=True)
class Curve:
    name: str
    title: str
    ylabel: str
    # How a point's own run time grows with its size, to predict the next one's: as
    # the size (its agents start, its records grow), or not at all (its rounds wait
    # a fixed time each, and a lost round ends the point).
    run_time_grows: bool = True


CURVES = {
    "fanout": Curve(
        "fanout",
        "Process fault -> the last replica holds its new Assign",
        "seconds from the fault",
    ),
    "detection": Curve(
        "detection",
        f"Hang detection past the {HEARTBEAT_TIMEOUT:g} s heartbeat timeout, under telemetry load",
        "seconds past the timeout",
        run_time_grows=False,
    ),
    "resize": Curve(
        "resize",
        "Grow decision -> the last replica's first step at the new size (control plane)",
        "seconds from the decision",
    ),
}


@dataclass(frozen=True)
class Options:
    rounds: int
    resize_rounds: int
    per_node: int
    processes: int


async def one_point(
    curve: str, servers: int, replicas: int, options: Options, folder: Path
) -> Point:
    """Measure ``curve`` at ``replicas`` on a fresh NATS of ``servers`` servers."""
    async with nats_of(servers, folder) as nats:
        hop = await one_hop_seconds(nats.settings("benchhop"))
        trip = await idle_round_trip_seconds(nats.settings("benchecho"))
        return await _measured(curve, nats, servers, replicas, options, folder, hop, trip)


async def _measured(
    curve: str,
    nats: Nats,
    servers: int,
    replicas: int,
    options: Options,
    folder: Path,
    hop: float,
    trip: float,
) -> Point:
    namespace = f"{curve}{replicas}"
    if curve == "fanout":
        values = await measure_fanout(
            nats, namespace, replicas, options.rounds, options.per_node, options.processes, folder
        )
        return point_of(curve, servers, replicas, values, hop, trip)
    if curve == "detection":
        found = await measure_detection(
            nats, namespace, replicas, options.rounds, options.per_node, folder
        )
        if not found.past_timeout:
            raise RuntimeError(f"no hang detected ({found.note()})")
        return point_of(curve, servers, replicas, found.past_timeout, hop, trip, found.note())
    resized = await measure_resize(
        nats,
        namespace,
        replicas,
        options.resize_rounds,
        options.per_node,
        options.processes,
        folder,
    )
    if not resized.stepped:
        raise RuntimeError(f"no grow ended ({resized.note()})")
    return point_of(curve, servers, replicas, resized.stepped, hop, trip, resized.note())


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return f"{os.cpu_count()} cores, {pages / 2**30:.0f} GiB; load average {load}"


def print_point(point: Point, seconds: float) -> None:
    row = point.row()
    print(
        f"{point.curve:<9} nats {point.nats_servers} {point.replicas:>6} replicas: "
        f"p50 {point.p50 * 1000:9.1f} ms  p99 {point.p99 * 1000:9.1f} ms  "
        f"(x hop {row['p50_x_hop']:>7} / {row['p99_x_hop']:>7}; "
        f"x trip {row['p50_x_trip']:>7} / {row['p99_x_trip']:>7}; "
        f"hop {row['hop_ms']} ms, trip {row['trip_ms']} ms) in {seconds:.0f} s"
        + (f"; {point.note}" if point.note else ""),
        flush=True,
    )


async def run_curve(
    curve: Curve,
    sizes: Sequence[int],
    servers: Sequence[int],
    options: Options,
    budget: float,
    notes: list[str],
    failed: dict[tuple[str, int], int],
) -> list[Point]:
    """Every point of one curve that the budget allows; the rest said in ``notes``,
    the smallest size that failed per NATS in ``failed``."""
    points: list[Point] = []
    for count in servers:
        took: tuple[int, float] | None = None
        for replicas in sorted(sizes):
            if took is not None and took[1] < 0:
                notes.append(
                    f"{curve.name}, nats {count}: {replicas} replicas not run: the {took[0]} "
                    "point failed"
                )
                print(notes[-1], flush=True)
                continue
            if took is not None:
                predicted = took[1] * (replicas / took[0] if curve.run_time_grows else 1)
                if predicted > budget:
                    notes.append(
                        f"{curve.name}, nats {count}: {replicas} replicas not run: the "
                        f"{took[0]} point took {took[1]:.0f} s, so about {predicted:.0f} s "
                        f"predicted, over the budget of {budget:.0f} s"
                    )
                    print(notes[-1], flush=True)
                    continue
            began = time.monotonic()
            try:
                with tempfile.TemporaryDirectory(prefix="resurge-scale-") as folder:
                    point = await one_point(curve.name, count, replicas, options, Path(folder))
            except (RuntimeError, TimeoutError) as error:
                notes.append(f"{curve.name}, nats {count}: {replicas} replicas failed: {error}")
                print(notes[-1], flush=True)
                failed.setdefault((curve.name, count), replicas)
                took = (replicas, -1.0)
                continue
            seconds = time.monotonic() - began
            took = (replicas, seconds)
            print_point(point, seconds)
            points.append(point)
    return points


def kept_from(path: Path, points: list[Point]) -> tuple[list[Point], list[str]]:
    """The measured points of the CSV at ``path`` that ``points`` do not measure again
    (another size or NATS), and that file's own lines, to keep beside them."""
    if not path.exists():
        return [], []
    text = path.read_text()
    now = {(p.nats_servers, p.replicas) for p in points}
    kept = [
        p for p in parse_csv(text) if not p.extrapolated and (p.nats_servers, p.replicas) not in now
    ]
    lines = [line[2:] for line in text.splitlines() if line.startswith("# ")]
    return kept, [line if line.startswith("earlier: ") else f"earlier: {line}" for line in lines]


def write_curve(
    curve: Curve,
    points: list[Point],
    wanted: Sequence[int],
    out: Path,
    header: list[str],
    notes: list[str],
    merge: bool,
    failed: dict[tuple[str, int], int],
) -> list[Point]:
    """The curve's CSV and PNG in ``out``, extrapolated to ``wanted``; its points. With
    ``merge``, the points of the CSV there that this run did not measure again are
    kept, under that file's lines."""
    from scale_plot import plot

    kept, earlier = kept_from(out / f"{curve.name}.csv", points) if merge else ([], [])
    every = extrapolate([*points, *kept], wanted, failed)
    mine = [n for n in notes if n.startswith(f"{curve.name},")]
    lines = [*header, f"curve: {curve.title}", *mine]
    if kept:
        sizes = ", ".join(f"nats {p.nats_servers} x {p.replicas}" for p in kept)
        lines += [f"kept from the earlier run below: {sizes}", *earlier]
    (out / f"{curve.name}.csv").write_text(csv_text(every, lines))
    caption = f"{header[0]}  |  {header[1]}"
    plot(every, curve.title, curve.ylabel, out / f"{curve.name}.png", caption)
    return every


def parse_sizes(text: str) -> list[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="256 and 1,024 replicas on 1 NATS server, 2 rounds (1 grow): under 3 minutes",
    )
    parser.add_argument("--sizes", type=parse_sizes, help="replicas, comma-separated")
    parser.add_argument("--nats", type=parse_sizes, help="NATS servers: 1,3 (quick: 1)")
    parser.add_argument("--curves", default=",".join(CURVES), help="fanout,detection,resize")
    parser.add_argument("--rounds", type=int, help="rounds per point (default 5; quick 2)")
    parser.add_argument("--resize-rounds", type=int, help="grows per point (default 2; quick 1)")
    parser.add_argument("--per-node", type=int, default=8, help="replicas to a node")
    parser.add_argument("--agent-processes", type=int, default=4)
    parser.add_argument(
        "--point-budget",
        type=float,
        default=300.0,
        help="seconds a point may be predicted to take (the one before it, scaled by size)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/scale"))
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the points of the CSVs in --out that this run does not measure again",
    )
    args = parser.parse_args(argv)
    # SIGTERM (a kill, a timeout) ends it as Ctrl-C does: the servers and services it
    # started are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sizes = args.sizes or list(QUICK_SIZES if args.quick else SIZES)
    servers = args.nats or ([1] if args.quick else [1, 3])
    options = Options(
        rounds=args.rounds or (2 if args.quick else 5),
        resize_rounds=args.resize_rounds or (1 if args.quick else 2),
        per_node=args.per_node,
        processes=args.agent_processes,
    )
    curves = [CURVES[name] for name in args.curves.split(",")]
    command = shlex.join([".venv/bin/python", "bench/scale_curves.py", *(argv or sys.argv[1:])])
    at_start = machine()
    print(f"{command}\nmachine: {at_start}", flush=True)
    began, date = time.monotonic(), datetime.now(UTC)
    notes: list[str] = []
    failed: dict[tuple[str, int], int] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = sorted({*sizes, *SIZES})
    for curve in curves:  # each written once measured: a run cut short keeps those done
        points = asyncio.run(
            run_curve(curve, sizes, servers, options, args.point_budget, notes, failed)
        )
        header = [
            f"made by: {command}",
            f"on {date:%Y-%m-%d %H:%M} UTC; machine: {at_start} at the start, "
            f"{machine().split('; ')[1]} when this curve was written, "
            f"{time.monotonic() - began:.0f} s into the run",
            f"layout: {options.per_node} replicas to a node, one worker each; "
            f"{options.processes} agent processes; rounds {options.rounds}, "
            f"resize rounds {options.resize_rounds}",
            "p50: median of the rounds; p99: nearest rank (of fewer than 100 rounds, the "
            "maximum); x hop / x trip: the same divided by the median JetStream hop / idle "
            "round trip measured on the same NATS just before the point",
        ]
        every = write_curve(curve, points, wanted, args.out, header, notes, args.merge, failed)
        for point in every:
            if point.extrapolated:
                print(
                    f"{point.curve:<9} nats {point.nats_servers} {point.replicas:>6} replicas: "
                    f"p50 {point.p50 * 1000:9.1f} ms  p99 {point.p99 * 1000:9.1f} ms  "
                    f"EXTRAPOLATED ({point.note})",
                    flush=True,
                )
    print(f"written: {', '.join(str(args.out / f'{c.name}.csv') for c in curves)} and .png")
    print(f"{time.monotonic() - began:.0f} s in all; machine at the end: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
