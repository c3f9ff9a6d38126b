"""The scale curves' numbers: percentiles, points, extrapolation, and their CSV.

A :class:`Point` is one latency at one size (replicas) on one NATS (1 server or a
cluster of 3): p50 and p99 over its samples, and the same as multiples of the idle
baselines measured in the same run (one JetStream hop, one round trip between two
idle processes). :func:`extrapolate` fills the sizes a run could not reach from the
measured points of the same curve and NATS: a power law ``p = a * N ** b`` through the
two largest measured sizes (the local slope on log-log axes, so a cost that grows
faster than linearly at the top is carried on as it grows there), marked
``extrapolated``; never at or past a size where the measurement failed.
:func:`csv_text` writes points under ``#`` lines that say which command made them and
on what machine.

Pure functions of their arguments: no clock, no I/O.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

__all__ = [
    "COLUMNS",
    "Point",
    "csv_text",
    "extrapolate",
    "parse_csv",
    "percentile",
    "point_of",
    "power_law",
]

COLUMNS = (
    "curve",
    "nats_servers",
    "replicas",
    "samples",
    "p50_s",
    "p99_s",
    "hop_ms",
    "trip_ms",
    "p50_x_hop",
    "p99_x_hop",
    "p50_x_trip",
    "p99_x_trip",
    "extrapolated",
    "note",
)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``: for p99 of fewer
    than 100 samples, their maximum. ValueError for no values."""
    if not values:
        raise ValueError("no values")
    if not 0 < q <= 1:
        raise ValueError(f"quantile {q} is not in (0, 1]")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class Point:
    """One latency (seconds) at ``replicas`` on a NATS of ``nats_servers`` servers,
    with the baselines of the same run (seconds; 0 where none was measured)."""

    curve: str
    nats_servers: int
    replicas: int
    samples: int
    p50: float
    p99: float
    hop: float
    trip: float
    extrapolated: bool = False
    note: str = ""

    def row(self) -> dict[str, str]:
        """The point as a CSV row (:data:`COLUMNS`)."""

        def times(value: float, base: float) -> str:
            return f"{value / base:.1f}" if base > 0 else ""

        return {
            "curve": self.curve,
            "nats_servers": str(self.nats_servers),
            "replicas": str(self.replicas),
            "samples": str(self.samples),
            "p50_s": f"{self.p50:.4f}",
            "p99_s": f"{self.p99:.4f}",
            "hop_ms": f"{self.hop * 1000:.3f}" if self.hop else "",
            "trip_ms": f"{self.trip * 1000:.3f}" if self.trip else "",
            "p50_x_hop": times(self.p50, self.hop),
            "p99_x_hop": times(self.p99, self.hop),
            "p50_x_trip": times(self.p50, self.trip),
            "p99_x_trip": times(self.p99, self.trip),
            "extrapolated": "yes" if self.extrapolated else "no",
            "note": self.note,
        }


def point_of(
    curve: str,
    nats_servers: int,
    replicas: int,
    values: Sequence[float],
    hop: float,
    trip: float,
    note: str = "",
) -> Point:
    """The measured point of ``values`` (seconds): their median as p50 (as the other
    benches print it) and their nearest-rank p99."""
    return Point(
        curve,
        nats_servers,
        replicas,
        len(values),
        statistics.median(values),
        percentile(values, 0.99),
        hop,
        trip,
        note=note,
    )


def power_law(low: tuple[float, float], high: tuple[float, float]) -> tuple[float, float]:
    """``(a, b)`` of ``y = a * x ** b`` through two points ``(x, y)`` of positive
    coordinates and different ``x``."""
    (x1, y1), (x2, y2) = low, high
    if min(x1, y1, x2, y2) <= 0 or x1 == x2:
        raise ValueError(f"no power law through {low} and {high}")
    b = math.log(y2 / y1) / math.log(x2 / x1)
    return y1 / x1**b, b


def extrapolate(
    points: Iterable[Point],
    sizes: Iterable[int],
    failed: Mapping[tuple[str, int], int] | None = None,
) -> list[Point]:
    """``points`` and, for each curve and NATS with two measured sizes or more, a point
    at each size of ``sizes`` it lacks, from the power law through its two largest
    measured sizes (p50 and p99 each their own, p99 never below p50), marked
    extrapolated and saying the exponent; none at or above the size where that curve
    and NATS ``failed`` (a measurement that broke there is not to be read as a trend).
    Sorted by curve, NATS and size."""
    measured = [p for p in points if not p.extrapolated]
    out = list(measured)
    wanted = sorted(set(sizes))
    for curve, servers in sorted({(p.curve, p.nats_servers) for p in measured}):
        mine = sorted(
            (p for p in measured if (p.curve, p.nats_servers) == (curve, servers)),
            key=lambda p: p.replicas,
        )
        have = {p.replicas for p in mine}
        if len(have) < 2:
            continue
        low, high = mine[-2], mine[-1]
        if low.replicas == high.replicas or min(low.p50, low.p99, high.p50, high.p99) <= 0:
            continue
        a50, b50 = power_law((low.replicas, low.p50), (high.replicas, high.p50))
        a99, b99 = power_law((low.replicas, low.p99), (high.replicas, high.p99))
        ceiling = (failed or {}).get((curve, servers))
        for size in wanted:
            if size in have or (ceiling is not None and size >= ceiling):
                continue
            out.append(
                replace(
                    high,
                    replicas=size,
                    samples=0,
                    p50=a50 * size**b50,
                    p99=max(a99 * size**b99, a50 * size**b50),  # never below its p50
                    extrapolated=True,
                    note=(
                        f"power law through {low.replicas} and {high.replicas}: "
                        f"p50 ~ N^{b50:.2f}, p99 ~ N^{b99:.2f}"
                    ),
                )
            )
    return sorted(out, key=lambda p: (p.curve, p.nats_servers, p.replicas))


def csv_text(points: Iterable[Point], header: Sequence[str]) -> str:
    """The points as CSV under ``header``'s lines, each as a ``#`` comment."""
    out = io.StringIO()
    for line in header:
        out.write(f"# {line}\n")
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for point in points:
        writer.writerow(point.row())
    return out.getvalue()


def parse_csv(text: str) -> list[Point]:
    """The points of :func:`csv_text`'s output (its ``#`` lines skipped)."""
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))

    def seconds(ms: str) -> float:
        return float(ms) / 1000 if ms else 0.0

    return [
        Point(
            row["curve"],
            int(row["nats_servers"]),
            int(row["replicas"]),
            int(row["samples"]),
            float(row["p50_s"]),
            float(row["p99_s"]),
            seconds(row["hop_ms"]),
            seconds(row["trip_ms"]),
            row["extrapolated"] == "yes",
            row["note"],
        )
        for row in rows
    ]
