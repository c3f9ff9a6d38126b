"""The results file each bench writes: the figures README and docs may quote.

A bench that prints a figure the docs quote also records it, with :func:`record`, in
``bench/results/<bench>.json``: the command that made it, the conditions it ran under
(machine, load), the date, and each figure by name with its value and unit. The files
are committed: they are the record a claim points to.

A claim in README.md or docs/*.md quotes a figure as a link to its file, the figure's
name as the fragment: ``[0.3 s](bench/results/recovery.json#process_restart_s)`` (from
docs/, ``../bench/results/...``). ``tests/unit/test_published_figures.py`` checks
every such link: the file and the figure exist, and the number in the link's text is
the recorded value at the precision the text shows, in its unit. So a figure changes in
the docs when a bench run changes it, or the test says which claim went stale.

    record("recovery", {"process_restart_s": (0.31, "s")},
           command=".venv/bin/python bench/recovery.py --kills 5",
           conditions="2 cores, load 2.1 (CI beside it)")
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["RESULTS", "Figure", "invoked", "machine", "record"]

RESULTS = Path(__file__).resolve().parent / "results"

Figure = tuple[float, str]
"""A figure's value and unit (``s``, ``ms``, ``x`` for a ratio, ``%``, or ``""``)."""


def machine() -> str:
    """This machine in words: cores and the load average when the bench ends."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} cores ({platform.machine()}), load {load:.1f}"


def invoked() -> str:
    """The command this bench was run with, as the docs write it."""
    arguments = " ".join(shlex.quote(a) for a in sys.argv[1:])
    return f".venv/bin/python bench/{Path(sys.argv[0]).name} {arguments}".strip()


def record(
    bench: str,
    figures: Mapping[str, Figure],
    *,
    command: str = "",
    conditions: str = "",
    results: Path = RESULTS,
) -> Path:
    """Record ``figures`` of ``bench`` in ``results/<bench>.json``; figures recorded
    before under other names stay (a run with other options may record others), those
    of the same names are replaced. ``command``: how the figures were made (default:
    this process's command line); ``conditions``: the load they were made under
    (default: :func:`machine`). Returns the file's path."""
    path = results / f"{bench}.json"
    kept: dict[str, object] = {}
    if path.exists():
        kept = dict(json.loads(path.read_text()).get("figures", {}))
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    for name, (value, unit) in figures.items():
        kept[name] = {
            "value": value,
            "unit": unit,
            "command": command or invoked(),
            "conditions": conditions or machine(),
            "measured": stamp,
        }
    body = {"bench": bench, "figures": dict(sorted(kept.items()))}
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path
