"""Figures quoted in README.md, docs/ and ``resurge --help`` are those the benches
recorded (bench/published.py): each quote links its results file and figure, and shows
the recorded value at the precision it shows; each recorded figure names the command of
a bench that exists.

No other measured-looking figure (:data:`FIGURE`: a number of seconds or milliseconds, a
share, a ratio) appears outside code, except one the text marks as no measurement:

- a default, written as one: ``default 300 s``, ``(default: 300 s)``, ``2 s by default``;
- a setting's value, right after the setting's name in backticks:
  `` `stop_seconds` 0.45 s ``, a table's `` | `stop_seconds` | 0.45 s | ``;
- a published figure, on a line that cites its publication: a link to it, an arXiv
  number, or an italic title with its year (``*The Llama 3 Herd of Models* (2024)``);
- a phrase listed in :data:`NOT_MEASURED` for its file, with why: a constant of the code
  (``STOPPED_RANK_SECONDS``), a bench's own setting, a published figure cited elsewhere.
  Each phrase must still be in its file and cover a figure, so the list stays as short
  as the docs need.

docs/scale.md's figures are those of docs/scale/*.csv (bench/scale_curves.py), recorded
into bench/results/scale_curves.json by bench/scale_record.py, and linked as any other.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from resurge.cli.main import _parser

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_CHECKED: dict[str, str] = {}  # a file not checked, with why (none now)
CHECKED = [doc for doc in DOCS if str(doc.relative_to(ROOT)) not in NOT_CHECKED]

QUOTE = re.compile(r"\[([^\]]+)\]\(((?:\.\./)*bench/results/[\w-]+\.json)#([\w.-]+)\)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# A measured-looking figure: a number with a unit of time, a share, or a ratio ("17.4x";
# "2 x 2" is a shape, not a ratio).
FIGURE = re.compile(r"(?<![\w.,-])\d[\d,]*(?:\.\d+)?(?:\s?(?:ms|s|seconds|%)|x)(?!\w)")

CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
DEFAULT_BEFORE = re.compile(r"\bdefault(?:s to| of| is)?:?\s*$")
DEFAULT_AFTER = re.compile(r"^,?\s+by default\b")
SETTING_BEFORE = re.compile(r"`[^`\n]+`:?\s*(?:\|\s*)?$")
CITATION = re.compile(r"\]\(https?://|\barXiv\s+\d{4}\.\d+|\*[^*\n]+\*,?\s\(?(?:19|20)\d\d\b")

# Phrases of each file whose figures are not measurements, and why.
NOT_MEASURED: dict[str, dict[str, str]] = {
    "README.md": {
        'against "above 90%"': "published: Llama 3 (cited in docs/simulation.md)",
        "against 97%": "published: ByteRobust (cited in docs/simulation.md)",
        "against 44% and 80%": "published: FT-HSDP (cited in docs/simulation.md)",
        "under a 3 s log rule": "the recovery bench's setting",
        "stops it 60 s": "the scaler bench's assumption",
        "stepped by -30 s and +60 s": "the chaos bench's setting",
        "past a 2 s timeout": "the scale bench's setting",
    },
    "docs/design.md": {"every 30 s": "a constant: the agents' catch-up period"},
    "docs/scale.md": {
        "past the 2 s timeout": "the scale bench's heartbeat timeout setting",
        "heartbeat timeout 2 s": "the scale bench's setting",
        "less the 2 s timeout": "the scale bench's setting",
        "passed the 2 s timeout": "the scale bench's setting",
        "settle time (10 s": "a constant: the scaler's settle time",
    },
    "docs/detectors.md": {
        "stopped for 2 s": "STOPPED_RANK_SECONDS, a constant",
        "in those 2 s": "STOPPED_RANK_SECONDS",
        "2 s is far above": "STOPPED_RANK_SECONDS",
        "a fault about 2 s after the stop": "STOPPED_RANK_SECONDS",
        "never less than 600 s": "the learned timeout's floor, a constant",
        "at least 600 s": "the learned start-up limit's floor, a constant",
        "more than 5 s between": "a constant: the detector's own pause",
        "grace of 10 s": "a constant",
        "may take 20 ms": "a constant: a pattern's time bound",
        "line 50 ms": "a constant: a line's time bound",
        "more than 1 s of the detector's time in 10 s": "constants: a rule's budget",
        "for 10 s after it is back": "a constant: the detector's grace after a cut",
    },
    "docs/elastic.md": {"waits 10 seconds": "a constant: the scaler's grow wait"},
    "docs/jobspec.md": {
        "at least 600 s": "the learned limits' floor, a constant",
        "a hang after 2 s": "STOPPED_RANK_SECONDS",
    },
    "docs/kubernetes.md": {
        "renewed for 15 s": "the Lease's default duration",
        "2/15 of it (2 s)": "the Lease's default duration's share",
        "2/3 (10 s)": "the Lease's default duration's share",
        "after 1 s, doubling up to 60 s": "constants: the retry's backoff",
        "(up to 60 s": "a constant: the agent's wait for its name",
    },
    "docs/metrics.md": {"5 times in 300 s": "the restart limit's constants"},
    "docs/nodes.md": {
        "checkpoint deadline plus 30 s": "a constant: the worker pods' NoExecute toleration "
        "margin (resurge.cluster.kubernetes.disruption)",
        "checkpoint bound plus 15 s": "a constant: the hold's margin "
        "(resurge_restarter.node_moves.HOLD_MARGIN_SECONDS)",
    },
    "docs/recovery.md": {
        "(about 2 s, or a log rule's timeout)": "STOPPED_RANK_SECONDS",
        "under a 3 s log rule": "the recovery bench's setting",
        "every 30 s, so a command": "a constant: the agents' catch-up period",
        "start-up limit (600 s": "the learned start-up limit's floor, a constant",
        "`evalPeriodSeconds` (600 s)": "evalPeriodSeconds's default",
        "Fallback: 30 s of running": "SETTLE_SECONDS, a constant",
        "ends 30 s after": "SETTLE_SECONDS",
        "a 3 s lease": "a constant: the plan's claim",
        "the goal of 5%": "issue 29's goal",
    },
    "docs/security.md": {"waits up to 30 s": "a constant: the agent's wait for its file"},
    "docs/simulation.md": {
        "| node | 10 s | node": "the gpu failure kind's default detection_seconds",
        "| node | 30 s | node": "the host failure kind's default detection_seconds",
        "| process | 120 s | process": "the network failure kind's default detection_seconds",
        "| process | 1 s | in_process": "the software failure kind's default detection_seconds",
        "| detection (every kind) | up to 120 s": "the failure kinds' detection_seconds",
        "2% of the nodes free": "bench/simulate.py's setting: spares, nodes // 50",
        "30 s checkpoint writes": "bench/simulate.py's setting: WRITE_SECONDS",
        "| checkpoint write | 30 s": "bench/simulate.py's setting: WRITE_SECONDS",
        "5-minute checkpoints written in 30 s": "bench/simulate.py's settings (--bad-nodes)",
        "(a 30 s write and": "bench/simulate.py's setting: WRITE_SECONDS",
        "a 30 s write every 3.5": "the projection's checkpoint settings",
        "snapshots costing **2% of each step**": "bench/simulate.py's --snapshot-overhead",
        "its snapshots cost their 2%": "bench/simulate.py's --snapshot-overhead",
        "snapshots 2% of a step": "the sensitivity run's snapshot_overhead, the default",
        "goal: under 60 s": "issue 30's goal",
        "cost 600 s and resurge's 26.3 s": "the former model's inputs, as issue 30 quotes them",
        "within 2% (": "the validation test's tolerance",
        "(10 min, 10 s),": "the validation grid's settings",
        "(60 min, 120 s)}, u0 = 90 s": "the validation grid's settings",
    },
}
# ``resurge --help`` and every subcommand's: phrases that are no measurement.
HELP_NOT_MEASURED = {"e.g. 90s,": "an example of --since's format"}


def quotes() -> list[tuple[Path, str, Path, str]]:
    found = []
    for doc in DOCS:
        for text, target, name in QUOTE.findall(doc.read_text()):
            found.append((doc, text, (doc.parent / target).resolve(), name))
    return found


def shown(text: str) -> tuple[float, int, str]:
    """The first number in a quote's text, its decimals, and what follows it."""
    match = NUMBER.search(text)
    assert match is not None, f"no number in the quote {text!r}"
    digits = match.group().replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return float(digits), decimals, text[match.end() :].strip()


def check_quote(text: str, figure: dict[str, object]) -> str | None:
    """What is wrong with quoting ``figure`` as ``text`` (None: nothing)."""
    value, decimals, rest = shown(text)
    recorded = figure["value"]
    assert isinstance(recorded, int | float)
    if round(float(recorded), decimals) != value:
        return f"shows {value}, the bench recorded {recorded}"
    unit = str(figure["unit"])
    if unit and not rest.startswith(unit):
        return f"shows the unit {rest!r}, the bench recorded {unit!r}"
    return None


def _blank(match: re.Match[str]) -> str:
    return re.sub(r"[^\n]", " ", match.group())


def _phrase(text: str) -> re.Pattern[str]:
    return re.compile(r"\s+".join(map(re.escape, text.split())))


def figures_in(text: str) -> Iterator[re.Match[str]]:
    """The figures of ``text`` outside code blocks, inline code and results links, as
    matches into ``text`` itself."""
    for pattern in (CODE_BLOCK, QUOTE, INLINE_CODE):
        text = pattern.sub(_blank, text)
    yield from FIGURE.finditer(text)


def marked(text: str, figure: re.Match[str]) -> bool:
    """Whether ``text`` marks ``figure`` as a default, a setting or a cited figure."""
    before, after = text[max(0, figure.start() - 40) : figure.start()], text[figure.end() :]
    start = text.rfind("\n", 0, figure.start()) + 1
    end = text.find("\n", figure.end())
    line = text[start : end if end >= 0 else len(text)]
    return bool(
        DEFAULT_BEFORE.search(before)
        or DEFAULT_AFTER.match(after[:20])
        or SETTING_BEFORE.search(before)
        or CITATION.search(line)
    )


def loose_figures(text: str, not_measured: Mapping[str, str]) -> tuple[list[str], set[str]]:
    """The figures of ``text`` quoted as measurements but not from a results file, each
    with its line; and the phrases of ``not_measured`` that allowed none."""
    spans = {phrase: [m.span() for m in _phrase(phrase).finditer(text)] for phrase in not_measured}
    unused = set(not_measured)
    loose = []
    for figure in figures_in(text):
        if marked(text, figure):
            continue
        covering = [
            phrase
            for phrase, found in spans.items()
            if any(s <= figure.start() and figure.end() <= e for s, e in found)
        ]
        shown = " ".join(figure.group().split())
        if covering:
            unused -= set(covering)
        else:
            loose.append(f"line {text.count(chr(10), 0, figure.start()) + 1}: {shown}")
    return loose, unused


def help_texts() -> Iterator[tuple[str, str]]:
    """``resurge --help`` and every subcommand's, by command."""
    pending = [("resurge", _parser())]
    while pending:
        name, parser = pending.pop()
        yield name, parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending += [(f"{name} {sub}", p) for sub, p in action.choices.items()]


def test_every_quote_shows_its_recorded_figure() -> None:
    wrong = []
    for doc, text, target, name in quotes():
        where = f"{doc.relative_to(ROOT)}: [{text}] -> {target.name}#{name}"
        if not target.is_file():
            wrong.append(f"{where}: no such results file")
            continue
        figures = json.loads(target.read_text())["figures"]
        if name not in figures:
            wrong.append(f"{where}: the bench recorded no figure {name!r}")
            continue
        problem = check_quote(text, figures[name])
        if problem is not None:
            wrong.append(f"{where}: {problem}")
    assert not wrong, "stale or unknown figures:\n" + "\n".join(wrong)
    assert quotes(), "README and docs quote no recorded figure"


@pytest.mark.parametrize(
    "doc", [str(doc.relative_to(ROOT)) for doc in CHECKED], ids=lambda name: name
)
def test_docs_quote_measured_figures_only_from_results(doc: str) -> None:
    loose, unused = loose_figures((ROOT / doc).read_text(), NOT_MEASURED.get(doc, {}))
    assert not loose, (
        f"{doc} quotes figures no bench recorded: link each to its results file "
        f"(bench/published.py), or mark it as no measurement ({__name__}'s docstring):\n"
        + "\n".join(loose)
    )
    assert not unused, f"{doc}: allowances that allow no figure any more: {sorted(unused)}"


def test_the_lists_name_only_files_that_are_checked() -> None:
    checked = {str(doc.relative_to(ROOT)) for doc in CHECKED}
    assert set(NOT_MEASURED) <= checked
    assert all((ROOT / name).is_file() for name in NOT_CHECKED)


def test_help_texts_quote_no_measured_figure() -> None:
    texts = dict(help_texts())
    assert {"resurge", "resurge events", "resurge simulate"} <= set(texts)
    loose = {}
    used: set[str] = set()
    for command, text in texts.items():
        found, unused = loose_figures(text, HELP_NOT_MEASURED)
        used |= set(HELP_NOT_MEASURED) - unused
        if found:
            loose[command] = found
    assert not loose, f"--help texts quote figures: {loose}"
    assert used == set(HELP_NOT_MEASURED)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_each_results_file_names_a_bench_that_exists(path: Path) -> None:
    body = json.loads(path.read_text())
    assert body["bench"] == path.stem
    assert body["figures"], f"{path.name} records no figure"
    for name, figure in body["figures"].items():
        command = figure["command"].split()
        assert command[0] == ".venv/bin/python", f"{name}: {figure['command']}"
        assert (ROOT / command[1]).is_file(), f"{name}: no bench {command[1]}"
        assert isinstance(figure["value"], int | float), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", figure["measured"]), name
        assert figure["conditions"], f"{name}: no conditions"


def test_a_quote_is_checked_at_its_precision_and_unit() -> None:
    figure: dict[str, object] = {"value": 0.3149, "unit": "s"}
    assert check_quote("about 0.3 s", figure) is None
    assert check_quote("0.31 s", figure) is None
    assert check_quote("0.32 s", figure) == "shows 0.32, the bench recorded 0.3149"
    assert check_quote("0.3 ms", figure) == "shows the unit 'ms', the bench recorded 's'"
    assert check_quote("1,024", {"value": 1024, "unit": ""}) is None


def test_what_counts_as_a_figure() -> None:
    text = "0.3 s, 12 ms, 17.4x, 97%, 10 seconds, 2 x 2 workers, 4 -> 2, node-2, 1,024 nodes"
    assert [m.group() for m in figures_in(text)] == ["0.3 s", "12 ms", "17.4x", "97%", "10 seconds"]


def test_what_marks_a_figure_as_no_measurement() -> None:
    text = """\
A restart took 0.4 s; the timeout (default 300 s), a ping every 2 s by default.
`stop_seconds` 0.45 s and | `warmup_seconds` | 10 s | are settings.
Meta, *The Llama 3 Herd of Models* (2024): above 90%; [FT-HSDP](https://arxiv.org/x) 44%.
Code: `sleep 5 s`, [0.51 s](bench/results/recovery.json#a_median_s) and

```
took 3.2 s
```
A rank stopped for 2 s is a fault, and 7.5 s were spent; the bench ran 23 s.
"""
    loose, unused = loose_figures(text, {"stopped for 2 s": "a constant", "gone 9 s": "stale"})
    assert loose == ["line 1: 0.4 s", "line 9: 7.5 s", "line 9: 23 s"]
    assert unused == {"gone 9 s"}
