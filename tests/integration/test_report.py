"""``resurge report``: a job with two faults and a resize, stored in a real nats-server as
the services store them, written as a PNG and a self-contained HTML page whose data
holds those marks (the data behind the picture is checked, not its pixels)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from resurge.cli.report import write_report
from resurge.runtime.bus import Bus
from tests.integration.stored_job import JOB, store_job


def _data(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', page)
    assert found, "the page carries its data"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


async def test_a_report_holds_the_faults_recoveries_and_resize(bus: Bus, tmp_path: Path) -> None:
    await store_job(bus)
    args = argparse.Namespace(job=JOB, out=tmp_path / "out")

    assert await write_report(bus, args) == 0

    png = (tmp_path / "out" / f"{JOB}.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    page = (tmp_path / "out" / f"{JOB}.html").read_text()
    assert "<svg" in page
    loads = re.findall(
        r'(?:src|href)\s*=\s*["\'](?:https?:)?//|<link|@import|url\(\s*["\']?http', page
    )
    assert loads == [], "the page opens offline: it loads nothing from the network"
    data = _data(page)
    faults = data["faults"]
    assert isinstance(faults, list)
    assert [(f["reason"], f["rank"], f["time"]) for f in faults] == [
        ("process_crash", 1, 20.3),
        ("process_crash", 0, 30.2),
    ]
    recoveries = data["recoveries"]
    assert [(r["level"], r["seconds"]) for r in recoveries] == [("process", 1.5)] * 2
    assert [(z["resize"], z["from"], z["to"]) for z in data["resizes"]] == [("grow", 2, 4)]
    assert [w for _, w in data["world"]] == [2, 4]
    summary = data["summary"]
    assert isinstance(summary, dict)
    assert summary["phase"] == "Succeeded" and summary["final_step"] == 49
    lost = summary["lost_seconds"]
    assert abs(lost["detection"] - 0.2) < 1e-6  # 0.1 s per fault
    assert lost["restart"] >= 3.0  # two recoveries of 1.5 s, and the resize's pause
    assert lost["redone_steps"] == 6.0  # steps 19, 20 and 23..26 again, at 1 s a step
    assert 0 < summary["goodput"] < 1
    assert "goodput" in page and "lost steps trained again" in page


async def test_a_job_with_nothing_stored_is_named(bus: Bus, tmp_path: Path) -> None:
    args = argparse.Namespace(job="never", out=tmp_path)
    assert await write_report(bus, args) == 1
    assert not (tmp_path / "never.png").exists() and not (tmp_path / "never.html").exists()
