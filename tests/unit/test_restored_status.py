"""`resurge status JOB` says where the latest generation's state came from (live memory,
peers, or the disk checkpoint and why), from the job record through its status view."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from resurge.cli.status import describe
from resurge.control.state.records import JobRecord, RestoredState, status_view
from resurge.jobspec import TrainingJobStatus
from resurge.local.job_factory import job


def resumed_line(restored: RestoredState | None) -> str:
    record = JobRecord(name="j", spec=job("j"), generation=3, restored=restored)
    view: dict[str, Any] = status_view(record)
    TrainingJobStatus.model_validate(view)  # the status model (and so the CRD) has it
    out = io.StringIO()
    Console(file=out, width=300, color_system=None).print(describe(view))
    line = next(line for line in out.getvalue().splitlines() if line.startswith("Resumed:"))
    return line.removeprefix("Resumed:").strip()


def test_a_resume_from_memory_and_peers_counts_the_ranks_of_each() -> None:
    restored = RestoredState(
        generation=3, step=119, ranks={"memory": [0, 2], "peer": [1]}, detail="rank 0's memory"
    )
    assert (
        resumed_line(restored) == "step 119 from memory (2 ranks) and peers (1 rank), generation 3"
    )


def test_a_fall_back_to_the_disk_says_why() -> None:
    restored = RestoredState(
        generation=3,
        step=100,
        ranks={"disk": [0, 1, 2, 3]},
        detail="no complete live copy (rank 3 and its buddy were lost)",
    )
    assert resumed_line(restored) == (
        "step 100 from the disk checkpoint (4 ranks), generation 3: no complete live copy "
        "(rank 3 and its buddy were lost)"
    )


def test_a_fresh_start_and_a_job_that_never_reported() -> None:
    restored = RestoredState(generation=0, ranks={"start": [0, 1]}, detail="nothing to resume")
    assert resumed_line(restored) == "a fresh start (2 ranks), generation 0: nothing to resume"
    assert resumed_line(None) == "none"


def test_the_json_view_counts_ranks_per_source() -> None:
    restored = RestoredState(
        generation=3, step=119, ranks={"memory": [0, 2], "peer": [1]}, detail="rank 0's memory"
    )
    view = status_view(JobRecord(name="j", spec=job("j"), generation=3, restored=restored))
    assert view["restored"] == {
        "generation": 3,
        "step": 119,
        "sources": {"memory": 2, "peer": 1},
        "detail": "rank 0's memory",
    }
