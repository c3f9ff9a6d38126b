"""Where a generation's ranks took their registered state from, folded into the job
record (:mod:`resurge.control.decisions.restore_reports`), and said in words by
``resurge events``."""

from __future__ import annotations

from resurge.control.decisions.restore_reports import (
    WORST_FIRST,
    apply_restored,
    live_state_serves_a_resize,
)
from resurge.control.state.records import JobRecord, Placement, RestoredState
from resurge.control.views.event_words import readable
from resurge.events import RESTORE_SOURCES, Source, StateRestored
from resurge.local.job_factory import job
from resurge.worker import wire


def record_at(generation: int) -> JobRecord:
    record = JobRecord(name="j", spec=job("j"), generation=generation)
    record.placements = [Placement(replica=0, node="n1"), Placement(replica=1, node="n2")]
    return record


def test_the_event_knows_every_source_the_wire_does_and_the_status_orders_them_all() -> None:
    assert RESTORE_SOURCES == wire.RESTORE_SOURCES
    assert sorted(WORST_FIRST) == sorted(RESTORE_SOURCES)


def test_ranks_are_counted_per_source_and_the_worst_source_says_why() -> None:
    record = record_at(3)
    assert apply_restored(record, 3, 0, 119, "memory", "step 119 from its own memory")
    assert apply_restored(record, 3, 2, 119, "peer", "step 119 from rank 0's memory")
    assert apply_restored(record, 3, 1, 119, "memory", "step 119 from its own memory")
    assert record.restored == RestoredState(
        generation=3,
        step=119,
        ranks={"memory": [0, 1], "peer": [2]},
        detail="step 119 from rank 0's memory",
    )
    # A redelivered report of a rank already counted changes nothing.
    assert not apply_restored(record, 3, 2, 119, "peer", "again")
    assert record.restored.ranks == {"memory": [0, 1], "peer": [2]}


def test_a_fall_back_to_the_disk_is_what_the_record_says() -> None:
    record = record_at(4)
    apply_restored(record, 4, 0, 100, "disk", "no complete live copy (rank 3's lost with n2)")
    apply_restored(record, 4, 1, 100, "disk", "no complete live copy (another rank's words)")
    assert record.restored is not None
    assert record.restored.ranks == {"disk": [0, 1]}
    assert (record.restored.step, record.restored.detail) == (
        100,
        "no complete live copy (rank 3's lost with n2)",
    )


def test_a_fresh_start_has_no_step() -> None:
    record = record_at(0)
    assert apply_restored(record, 0, 0, None, "start", "nothing to resume from")
    assert record.restored == RestoredState(
        generation=0, step=None, ranks={"start": [0]}, detail="nothing to resume from"
    )


def test_an_older_generation_is_ignored_and_a_newer_one_starts_afresh() -> None:
    record = record_at(5)
    apply_restored(record, 5, 0, 200, "disk", "no complete live copy")
    # Generation 4's report, late: the record is at 5.
    assert not apply_restored(record, 4, 1, 190, "memory", "late")
    assert record.restored is not None and record.restored.ranks == {"disk": [0]}
    # The record moves on to generation 6: its first report replaces generation 5's.
    record.generation = 6
    assert apply_restored(record, 6, 1, 230, "memory", "its own memory")
    assert record.restored == RestoredState(
        generation=6, step=230, ranks={"memory": [1]}, detail="its own memory"
    )
    # A report without a generation or rank (not from a worker) is not counted.
    assert not apply_restored(record, None, 0, 230, "memory", "")
    assert not apply_restored(record, 6, None, 230, "memory", "")


def restored(rank: int, step: int | None, origin: str, detail: str = "") -> StateRestored:
    return StateRestored.model_validate(
        {
            "source": Source(service="node-agent", instance="n1:1"),
            "job": "j",
            "replica": 0,
            "node": "n1",
            "generation": 2,
            "rank": rank,
            "local_rank": rank,
            "step": step,
            "origin": origin,
            "detail": detail,
        }
    )


def test_resurge_events_says_where_rank_0_resumed_from() -> None:
    assert readable(restored(0, 119, "peer")) == "rank 0 resumed at step 119, its state from a peer"
    assert readable(restored(0, 100, "disk", "no complete live copy")) == (
        "rank 0 resumed at step 100, its state from the disk checkpoint: no complete live copy"
    )
    assert readable(restored(0, None, "start", "nothing to resume")) == (
        "rank 0 started fresh: nothing to resume"
    )
    assert readable(restored(1, 119, "memory")) is None  # one line per generation


def test_a_resize_takes_replicated_live_state_from_memory_but_not_shards() -> None:
    record = record_at(3)
    assert not live_state_serves_a_resize(record)  # nobody reported protected state
    apply_restored(record, 3, 0, 119, "memory", "step 119 from its own memory")
    assert live_state_serves_a_resize(record)
    record.generation = 4  # a new generation whose ranks did not report yet
    assert not live_state_serves_a_resize(record)
    apply_restored(record, 4, 0, 120, "memory", "step 120", sharded=True)
    assert record.restored is not None and record.restored.sharded
    assert not live_state_serves_a_resize(record)  # a shard serves only its world size
    line = wire.restored_line(4, 120, "memory", "step 120", sharded=True)
    assert wire.parse_worker_message(line) == wire.RestoreReport(4, 120, "memory", "step 120", True)


def test_a_resize_takes_shards_from_memory_only_when_every_rank_can_cut_them_again() -> None:
    record = record_at(5)
    apply_restored(record, 5, 0, 40, "memory", "step 40", sharded=True, reshardable=True)
    assert record.restored is not None and record.restored.reshardable
    assert live_state_serves_a_resize(record)  # FSDP2's DTensors: re-cut from memory
    apply_restored(record, 5, 1, 40, "peer", "step 40", sharded=True, reshardable=False)
    assert record.restored is not None and not record.restored.reshardable
    assert not live_state_serves_a_resize(record)  # one rank's cannot: a checkpoint first
    replicated = record_at(6)
    apply_restored(replicated, 6, 0, 40, "memory", "step 40")
    assert replicated.restored is not None and not replicated.restored.reshardable
    line = wire.restored_line(5, 40, "memory", "step 40", sharded=True, reshardable=True)
    assert wire.parse_worker_message(line) == wire.RestoreReport(
        5, 40, "memory", "step 40", sharded=True, reshardable=True
    )
