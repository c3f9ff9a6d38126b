"""docs/nodes.md cannot go stale: its attribution table lists every rule of
resurge/data/node_attribution.yaml, in order, with the rule's weight, reasons and
version; its settings are those of :class:`Settings`; docs/index.md links it."""

from __future__ import annotations

import re
from pathlib import Path

from resurge.control.decisions.node_attribution import rules, table_version
from resurge.runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "nodes.md"
# A cell boundary: a '|' not escaped (a regular expression's '|' in a cell is '\|').
CELL = re.compile(r"(?<!\\)\|")


def table_rows() -> list[list[str]]:
    """The attribution table's rows (those whose first cell is a rule in backticks)."""
    section = DOC.read_text().split("## The attribution table", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in CELL.split(line)[1:-1]]
        if cells and re.fullmatch(r"`\w+`", cells[0]):
            rows.append(cells)
    return rows


def test_the_doc_lists_every_rule_in_order_with_its_weight_and_reasons() -> None:
    rows = table_rows()
    assert [row[0].strip("`") for row in rows] == [rule.name for rule in rules()]
    for row, rule in zip(rows, rules(), strict=True):
        assert float(row[3]) == rule.weight, rule.name
        assert re.findall(r"`(\w+)`", row[1]) == rule.reason, rule.name
        assert row[4] == rule.needs, rule.name


def test_the_doc_names_the_table_s_version() -> None:
    assert f"`shared/resurge/data/node_attribution.yaml` (version {table_version()})" in (
        DOC.read_text()
    )


def test_the_settings_and_defaults_are_the_settings_models() -> None:
    text = DOC.read_text()
    fields = Settings.model_fields
    for name in ("node_quarantine", "node_quarantine_score", "node_score_half_life_hours"):
        default = fields[name].default
        shown = default if isinstance(default, str) else f"{default:g}"
        row = f"| `RESURGE_{name.upper()}` | `{shown}` |"
        assert row in text, row


def test_the_index_links_it() -> None:
    assert "(nodes.md)" in (ROOT / "docs" / "index.md").read_text()
