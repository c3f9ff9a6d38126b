"""``resurge status``: the jobs table and one job described, from a job's record and
what the streams keep of it (a real nats-server); rendered at 80 columns."""

from __future__ import annotations

import argparse
import io
import json
from datetime import timedelta

import pytest
from rich.console import Console

from resurge.cli.status import describe, jobs_table, show_status
from resurge.control.decisions.admission import new_record
from resurge.control.state.records import JobStore
from resurge.events import JobDeleted, JobPhase, JobSubmitted
from resurge.local.job_factory import job
from resurge.runtime.bus import Bus
from tests.integration.stored_job import JOB, START, store_job


async def _running(bus: Bus) -> None:
    record = new_record(job(JOB, nproc=1, replicas=2), None)
    record.phase = JobPhase.RUNNING
    record.submitted = START - timedelta(seconds=1)  # the stored events are of this run
    assert await JobStore(await bus.jobs_bucket()).create(record)
    await store_job(bus, total_steps=100)


def _args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**{"job": None, "json": False, "once": True, **given})


def _at_80(renderable: object) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(renderable)
    return out.getvalue().splitlines()


async def test_json_keeps_the_record_and_adds_step_pace_goodput_and_history(
    bus: Bus, capsys: pytest.CaptureFixture[str]
) -> None:
    await _running(bus)
    assert await show_status(bus, _args(job=JOB, json=True)) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["name"] == JOB and view["phase"] == "Running"
    assert view["step"] == 49 and view["finalStep"] == 100
    assert 0.5 < view["stepsPerSecond"] <= 1.0  # one step a second, with the pauses
    assert 0 < view["goodput"] < 1
    assert [(f["reason"], f["rank"], f["node"]) for f in view["recentFaults"]] == [
        ("process_crash", 1, "node-1"),
        ("process_crash", 0, "node-0"),
    ]
    assert [r["level"] for r in view["recentRecoveries"]] == ["process", "process"]


async def test_the_table_fits_80_columns_with_a_progress_bar(bus: Bus) -> None:
    await _running(bus)
    from resurge.cli.status import _views

    lines = _at_80(jobs_table(await _views(bus, None)))
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].split()[:3] == ["JOB", "PHASE", "GEN"]
    assert JOB in lines[1] and "Running" in lines[1] and "49/100" in lines[1]
    [bar] = [line for line in lines[2:] if line.startswith(JOB)]
    assert bar.rstrip().endswith("49%") and "━" in bar


async def test_one_job_described_in_words(bus: Bus) -> None:
    await _running(bus)
    from resurge.cli.status import _views

    [view] = await _views(bus, JOB)
    text = "\n".join(_at_80(describe(view)))
    assert "Phase:" in text and "Running" in text
    assert "process_crash (rank 1, node node-1): rank 1 was killed by SIGKILL" in text
    assert "process level, from process_crash, in 1.50 s" in text
    assert "Alerts:\n  none" in text


async def test_no_jobs_says_so(bus: Bus, capsys: pytest.CaptureFixture[str]) -> None:
    assert await show_status(bus, _args()) == 0
    assert capsys.readouterr().out.strip() == "no jobs"


async def test_an_unknown_job_is_an_error(bus: Bus, capsys: pytest.CaptureFixture[str]) -> None:
    assert await show_status(bus, _args(job="ghost")) == 1
    assert "no job named 'ghost'" in capsys.readouterr().err


async def test_a_deleted_run_is_shown_by_its_uid_and_an_unknown_uid_lists_the_runs(
    bus: Bus, capsys: pytest.CaptureFixture[str]
) -> None:
    # The stored job's run: submitted before its events, deleted after them.
    spec = job(JOB, nproc=1, replicas=2)
    submitted = JobSubmitted(
        source=bus.source, job=JOB, spec=spec, time=START - timedelta(seconds=1)
    )
    await bus.publish(bus.subjects.job(JOB), submitted)
    await store_job(bus, total_steps=100)
    deleted = JobDeleted(source=bus.source, job=JOB, time=START + timedelta(seconds=61))
    await bus.publish(bus.subjects.job(JOB), deleted)
    assert await show_status(bus, _args(job=JOB, json=True, uid=submitted.id)) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["uid"] == submitted.id and view["phase"] == "Succeeded"
    assert view["step"] == 49 and view["deleted"] is not None
    assert [f["rank"] for f in view["recentFaults"]] == [1, 0]
    assert await show_status(bus, _args(job=JOB, uid="nosuchrun")) == 1
    error = capsys.readouterr().err
    assert "no run 'nosuchrun'" in error and submitted.id in error
