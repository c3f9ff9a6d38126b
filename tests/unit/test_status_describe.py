"""`resurge status JOB`'s describe view, as a person reads it: the last resize has its
line (docs/elastic.md promises it)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from resurge.cli.status import describe


def shown(view: dict[str, Any]) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(describe(view))
    return out.getvalue()


def view(**fields: Any) -> dict[str, Any]:
    return {"name": "j", "phase": "Running", "generation": 3, **fields}


def test_the_last_resize_is_described_in_one_line() -> None:
    resize = {
        "resize": "grow",
        "from": 2,
        "to": 3,
        "why": "node-2 has room",
        "time": "2026-01-01T12:00:05+00:00",
        "seconds": 4.2,
    }
    text = shown(view(lastResize=resize))
    line = next(line for line in text.splitlines() if line.startswith("Last resize:"))
    assert "grow 2 -> 3 replicas at 12:00:05, 4.20 s to the first step" in line
    assert line.endswith("node-2 has room")


def test_a_job_never_resized_says_none() -> None:
    text = shown(view(lastResize=None))
    assert any(line.split() == ["Last", "resize:", "none"] for line in text.splitlines())
