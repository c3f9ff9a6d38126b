"""The job lifecycle table: every phase change goes through move_to, which refuses a
move the table does not hold, and no module writes a record's phase by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from resurge.control.decisions.lifecycle import TRANSITIONS, PhaseMoveError, move_to
from resurge.control.state.records import JobRecord
from resurge.events import JobPhase
from resurge.local.job_factory import job

REPO = Path(__file__).resolve().parents[2]


def record(phase: JobPhase) -> JobRecord:
    return JobRecord(name="j", spec=job("j"), phase=phase)


def test_a_finished_job_moves_nowhere() -> None:
    for finished in (JobPhase.SUCCEEDED, JobPhase.FAILED):
        for target in JobPhase:
            with pytest.raises(PhaseMoveError, match=f"from {finished.value} to {target.value}"):
                move_to(record(finished), target, "again")


def test_a_pending_job_is_admitted_before_it_can_recover_resize_or_end() -> None:
    for target in (JobPhase.RECOVERING, JobPhase.RESIZING, JobPhase.SUCCEEDED, JobPhase.FAILED):
        with pytest.raises(PhaseMoveError):
            move_to(record(JobPhase.PENDING), target, "skipping admission")


def test_a_move_writes_the_phase_and_why_and_returns_the_phase_left() -> None:
    moved = record(JobPhase.RUNNING)
    assert move_to(moved, JobPhase.RECOVERING, "recovering from crash") is JobPhase.RUNNING
    assert (moved.phase, moved.message) == (JobPhase.RECOVERING, "recovering from crash")


def test_every_phase_has_a_row() -> None:
    assert set(TRANSITIONS) == set(JobPhase)


def test_no_module_writes_a_phase_but_the_lifecycle() -> None:
    """``record.phase = ...`` anywhere in the product but lifecycle.py is a bypass."""
    offences = []
    for folder in ("shared", "services"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "lifecycle.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Assign | ast.AugAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        if (
                            isinstance(target, ast.Attribute)
                            and target.attr == "phase"
                            and isinstance(target.value, ast.Name)
                            and target.value.id == "record"
                        ):
                            offences.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offences == []
