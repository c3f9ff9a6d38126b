"""Record the scale curves' points as figures docs may quote (bench/results/scale_curves.json).

``bench/scale_curves.py`` writes its points to ``docs/scale/<curve>.csv``, each file headed
by the command that made it and the machine's load; this records every point of those
files with that command and those conditions (bench/published.py), so docs/scale.md quotes
them as links the figures test checks:
``[114 ms](../bench/results/scale_curves.json#fanout_nats1_256_p50_ms)``. An extrapolated
point's names end in ``_extrapolated``: a quote of one says so in its link. A resize
point's stage medians (its note: "medians from the decision (s): warm-up 0.01, last
checkpoint sent 0.22, ...") are recorded too, as ``resize_nats1_256_stage_<stage>_s``.

    .venv/bin/python bench/scale_record.py [--from docs/scale]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from published import RESULTS, Figure, record
from scale_fit import parse_csv

CURVES = ("fanout", "detection", "resize")


def figures_of(text: str) -> dict[str, Figure]:
    """Each point's p50 and p99 (ms) of one curve's CSV, by name."""
    figures: dict[str, Figure] = {}
    for point in parse_csv(text):
        tail = "_extrapolated" if point.extrapolated else ""
        name = f"{point.curve}_nats{point.nats_servers}_{point.replicas}"
        figures[f"{name}_p50_ms{tail}"] = (round(point.p50 * 1000, 1), "ms")
        figures[f"{name}_p99_ms{tail}"] = (round(point.p99 * 1000, 1), "ms")
        for stage, seconds in stages(point.note).items():
            figures[f"{name}_stage_{stage}_s"] = (seconds, "s")
    return figures


def stages(note: str) -> dict[str, float]:
    """The stage medians of a resize point's note, by a name made of the stage's words."""
    if "medians from the decision (s):" not in note:
        return {}
    listed = note.split("medians from the decision (s):", 1)[1].split(";", 1)[0]
    found = {}
    for part in listed.split(","):
        words = re.fullmatch(r"\s*(.+?)\s+(\d+(?:\.\d+)?)\s*", part)
        if words is not None:
            found[re.sub(r"\W+", "_", words.group(1).lower()).strip("_")] = float(words.group(2))
    return found


def header(text: str, key: str) -> str:
    """The value of one ``# key: value`` line of a CSV's header ('' if none)."""
    for line in text.splitlines():
        if line.startswith(f"# {key}"):
            return line.removeprefix(f"# {key}").lstrip(": ").strip()
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, default=Path("docs/scale"))
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for curve in CURVES:
        path = args.source / f"{curve}.csv"
        if not path.exists():
            continue
        text = path.read_text()
        record(
            "scale_curves",
            figures_of(text),
            command=header(text, "made by"),
            conditions=header(text, "on"),
            results=args.results,
        )
        print(f"recorded {curve}: {len(figures_of(text))} figures from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
