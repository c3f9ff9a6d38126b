"""Figures quoted in README.md and docs/ are those the benches recorded
(bench/published.py): each quote links its results file and figure, and shows the
recorded value at the precision it shows; the README's opening claims quote no figure
any other way; each recorded figure names the command of a bench that exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

QUOTE = re.compile(r"\[([^\]]+)\]\(((?:\.\./)*bench/results/[\w-]+\.json)#([\w.-]+)\)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# A measured-looking figure: a number with a unit of time, a share, or a ratio ("17.4x";
# "2 x 2" is a shape, not a ratio).
FIGURE = re.compile(r"(?<![\w.,-])\d[\d,]*(?:\.\d+)?(?:\s?(?:ms|s|%)|x)(?!\w)")


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


def test_the_readme_s_opening_quotes_figures_only_from_results() -> None:
    opening = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    prose = re.sub(r"```.*?```", "", opening, flags=re.S)
    prose = QUOTE.sub("", prose)
    prose = re.sub(r"`[^`]*`", "", prose)
    loose = FIGURE.findall(prose)
    assert not loose, f"README's opening quotes figures no bench recorded: {loose}"
    assert quotes(), "README and docs quote no recorded figure"


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
    text = "0.3 s, 12 ms, 17.4x, 97%, 2 x 2 workers, 4 -> 2, node-2, 1,024 nodes"
    assert FIGURE.findall(text) == ["0.3 s", "12 ms", "17.4x", "97%"]
