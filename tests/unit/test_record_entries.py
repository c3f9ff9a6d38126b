"""How a job record is stored: JSON, compressed once large, ranks as runs; what a large
job's record weighs against NATS's 1 MiB message limit."""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from resurge.control.state.records import (
    COMPRESSED_ABOVE,
    CheckpointReports,
    JobRecord,
    PendingRecovery,
    Placement,
    RestoredState,
)
from resurge.events import RecoveryLevel
from resurge.local import job_factory

NATS_MAX_PAYLOAD = 1024 * 1024  # nats-server's default max_payload


def record(replicas: int, *, reports: int = 0, pending: bool = False) -> JobRecord:
    """A job of ``replicas`` replicas of one worker, each on its own node; ``reports``
    steps some ranks reported saving (all but one); a process restart pending."""
    placements = [
        Placement(replica=r, node=f"node-{r:05d}", address=f"10.{r >> 16}.{r >> 8 & 255}.{r & 255}")
        for r in range(replicas)
    ]
    now = datetime.now(UTC)
    plan = PendingRecovery(
        fault_id="f-1",
        level=RecoveryLevel.PROCESS,
        detected_at=now,
        from_generation=1,
        to_generation=2,
        stop_placements=placements,
        start_at=now,
    )
    return JobRecord(
        name="big",
        spec=job_factory.job("big", preload=None),
        generation=1,
        placements=placements,
        pending_recovery=plan if pending else None,
        checkpoint_reports=[
            CheckpointReports(
                generation=1, world_size=replicas, step=step, ranks=list(range(replicas - 1))
            )
            for step in range(reports)
        ],
    )


def test_a_small_record_is_stored_as_its_json() -> None:
    small = record(4)
    stored = small.to_entry()
    assert stored.startswith(b"{")
    assert len(stored) <= COMPRESSED_ABOVE
    assert JobRecord.from_entry(stored) == small


def test_a_large_record_is_stored_compressed_and_reads_back_the_same() -> None:
    large = record(1024, reports=2, pending=True)
    stored = large.to_entry()
    assert not stored.startswith(b"{")
    assert len(zlib.decompress(stored)) > COMPRESSED_ABOVE
    assert JobRecord.from_entry(stored) == large


def test_16384_replicas_with_a_plan_and_eight_steps_of_reports_fit_one_nats_message() -> None:
    # The scale bench's fan-out at 16,384 replicas was refused: the record with its plan
    # (every placement twice) was over 1 MiB.
    largest = record(16384, reports=8, pending=True)
    assert len(largest.model_dump_json()) > NATS_MAX_PAYLOAD  # it would be, uncompressed
    assert len(largest.to_entry()) < NATS_MAX_PAYLOAD / 2


def test_ranks_are_stored_as_runs() -> None:
    reports = CheckpointReports(generation=0, world_size=9, step=5, ranks=[0, 1, 2, 3, 5, 7, 8])
    assert json.loads(reports.model_dump_json())["ranks"] == [[0, 3], [5, 5], [7, 8]]
    assert CheckpointReports.model_validate_json(reports.model_dump_json()) == reports
    restored = RestoredState(generation=1, ranks={"peer": [2, 3], "disk": [0]})
    assert json.loads(restored.model_dump_json())["ranks"] == {"peer": [[2, 3]], "disk": [[0, 0]]}
    assert RestoredState.model_validate_json(restored.model_dump_json()) == restored


def test_ranks_stored_one_by_one_by_an_earlier_release_still_read() -> None:
    earlier = {"generation": 0, "world_size": 4, "step": 5, "ranks": [0, 2, 3]}
    assert CheckpointReports.model_validate(earlier).ranks == [0, 2, 3]


def test_a_bad_run_of_ranks_is_refused_with_what_is_wrong() -> None:
    with pytest.raises(ValidationError, match=r"a run of ranks is \[first, last\]"):
        CheckpointReports.model_validate(
            {"generation": 0, "world_size": 4, "step": 5, "ranks": [[3, 1]]}
        )


def test_an_entry_that_is_neither_json_nor_compressed_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="neither JSON nor zlib"):
        JobRecord.from_entry(b"\x00garbage")


def test_a_copy_to_change_shares_nothing() -> None:
    original = record(4, reports=1)
    copy = original.copy_to_change()
    assert copy == original
    copy.placements.append(Placement(replica=4, node="node-4"))
    copy.checkpoint_reports[0].ranks.append(3)
    assert len(original.placements) == 4
    assert original.checkpoint_reports[0].ranks == [0, 1, 2]
