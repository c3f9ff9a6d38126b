"""Checkpoint reports counted into the resume point: per generation and world size, pure."""

from __future__ import annotations

from resurge.control.decisions.checkpoint_count import STEPS_KEPT, apply_checkpoint
from resurge.control.state.records import CheckpointReports, JobRecord, Placement
from resurge.events import JobPhase
from resurge.local import job_factory


def record(generation: int = 1, replicas: int = 2) -> JobRecord:
    """A running job of ``replicas`` replicas of 2 workers each."""
    job = job_factory.job("j", nproc=2, replicas=replicas, preload=None)
    return JobRecord(
        name="j",
        spec=job,
        phase=JobPhase.RUNNING,
        generation=generation,
        placements=[Placement(replica=r, node=f"n{r}") for r in range(replicas)],
    )


def saved(
    rec: JobRecord, rank: int, step: int, *, generation: int | None, world_size: int | None = 4
) -> bool:
    """Rank ``rank`` of ``generation`` (of ``world_size`` ranks) saved ``step``."""
    path = f"/c/step-{step}"
    return apply_checkpoint(rec, rank, step, path, generation=generation, world_size=world_size)


def test_the_halves_of_two_generations_do_not_make_a_step_complete() -> None:
    rec = record(generation=1)
    for rank in (0, 1):
        assert saved(rec, rank, 100, generation=0)
    for rank in (2, 3):
        assert saved(rec, rank, 100, generation=1)
    assert rec.latest_checkpoint is None
    assert [(e.generation, e.step, e.ranks) for e in rec.checkpoint_reports] == [
        (0, 100, [0, 1]),
        (1, 100, [2, 3]),
    ]
    for rank in (0, 1):
        assert saved(rec, rank, 100, generation=1)
    assert rec.latest_checkpoint is not None and rec.latest_checkpoint.step == 100
    assert rec.checkpoint_reports == []


def test_a_generation_completes_at_its_own_world_size() -> None:
    rec = record(generation=2)  # now 4 ranks; generation 1 ran 2
    assert saved(rec, 0, 60, generation=1, world_size=2)
    assert rec.latest_checkpoint is None
    assert saved(rec, 1, 60, generation=1, world_size=2)
    assert rec.latest_checkpoint is not None and rec.latest_checkpoint.step == 60


def test_one_generation_at_two_world_sizes_is_counted_apart() -> None:
    rec = record(generation=1)
    saved(rec, 0, 10, generation=1, world_size=2)
    saved(rec, 1, 10, generation=1, world_size=4)
    assert rec.latest_checkpoint is None and len(rec.checkpoint_reports) == 2


def test_a_report_without_world_size_counts_only_in_the_current_generation() -> None:
    rec = record(generation=3)
    for rank in range(4):
        assert not saved(rec, rank, 30, generation=2, world_size=None)
    for rank in range(4):
        saved(rec, rank, 30, generation=3, world_size=None)
    assert rec.latest_checkpoint is not None and rec.latest_checkpoint.step == 30


def test_reports_that_cannot_be_placed_are_not_counted() -> None:
    rec = record(generation=1)
    assert not saved(rec, 0, 10, generation=None)  # an event that names no generation
    assert not saved(rec, 4, 10, generation=1)  # rank 4 of 4
    pending = record(generation=0)
    pending.placements = []  # Pending: no placements, world size 0
    assert not saved(pending, 0, 10, generation=0, world_size=None)
    assert rec.checkpoint_reports == [] and pending.checkpoint_reports == []


def test_repeats_and_steps_not_past_the_resume_point_change_nothing() -> None:
    rec = record(generation=0, replicas=1)
    assert saved(rec, 0, 10, generation=0, world_size=2)
    assert not saved(rec, 0, 10, generation=0, world_size=2)
    assert saved(rec, 0, 20, generation=0, world_size=2)
    assert saved(rec, 1, 10, generation=0, world_size=2)
    assert rec.latest_checkpoint is not None and rec.latest_checkpoint.step == 10
    assert [e.step for e in rec.checkpoint_reports] == [20]
    assert not saved(rec, 1, 5, generation=0, world_size=2)
    assert saved(rec, 1, 20, generation=0, world_size=2)
    assert rec.latest_checkpoint.step == 20 and rec.checkpoint_reports == []


def test_only_the_newest_steps_are_kept() -> None:
    rec = record(generation=0)
    for step in range(1, STEPS_KEPT + 3):
        saved(rec, 0, step, generation=0)
    assert [e.step for e in rec.checkpoint_reports] == list(range(3, STEPS_KEPT + 3))


def test_a_record_of_the_old_shape_loads_without_its_unattributed_reports() -> None:
    """Records written before reports were kept per generation held ``{step: ranks}``."""
    stored = record().model_dump(mode="json")
    stored["checkpoint_reports"] = {"20": [0, 1]}
    stored["latest_checkpoint"] = {"step": 10, "path": "/c/step-10"}
    loaded = JobRecord.model_validate(stored)
    assert loaded.checkpoint_reports == []
    assert loaded.latest_checkpoint is not None and loaded.latest_checkpoint.step == 10
    again = JobRecord.model_validate_json(loaded.model_dump_json())
    assert again == loaded


def test_the_new_shape_round_trips() -> None:
    rec = record()
    saved(rec, 2, 50, generation=1)
    again = JobRecord.model_validate_json(rec.model_dump_json())
    assert again.checkpoint_reports == [
        CheckpointReports(generation=1, world_size=4, step=50, ranks=[2])
    ]
