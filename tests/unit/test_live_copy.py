"""The resume rule of checkpointless recovery (resurge.worker.live_copy.plan): one step for
every rank, the newest whose state is complete among them, or the disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resurge.worker.live_copy import REPLICATED, Held, plan, shard_key
from resurge.worker.snapshot_folder import KEEP, SnapshotFolder


def replicated(*steps: int) -> list[Held]:
    return [Held(REPLICATED, step) for step in steps]


def test_replicated_state_resumes_at_the_newest_step_anyone_holds() -> None:
    # Rank 1 is new (its node was lost); rank 0 wrote step 7 before the fault, rank 2 not yet.
    decided = plan([replicated(6, 7), [], replicated(5, 6)], sharded=False)
    assert decided.step == 7
    assert decided.sources == {0: (REPLICATED, None), 1: (REPLICATED, 0), 2: (REPLICATED, 0)}
    assert decided.sends(0) == [(REPLICATED, 1), (REPLICATED, 2)]
    assert decided.sends(2) == []


def test_sharded_state_needs_every_shard_at_one_step() -> None:
    def shards(rank: int, *steps: int) -> list[Held]:
        return [Held(shard_key(rank, 3), step) for step in steps]

    # Rank 2 died during step 8: its shard of 8 never got written; 7 is whole everywhere.
    held = [shards(0, 7, 8), shards(1, 7, 8), shards(2, 6, 7)]
    assert plan(held, sharded=True).step == 7
    # Its node lost, but a buddy (rank 0) holds its shard of 7: still live.
    held = [shards(0, 7, 8) + shards(2, 6, 7), shards(1, 7, 8), []]
    decided = plan(held, sharded=True)
    assert decided.step == 7 and decided.sources[2] == (shard_key(2, 3), 0)
    # Its node and its buddy both lost: no complete step, the disk.
    decided = plan([shards(0, 7, 8), shards(1, 7, 8), []], sharded=True)
    assert decided.step is None and "lacks shards [2]" in decided.reason


def test_shards_cut_for_another_world_size_fall_back_to_the_disk() -> None:
    held = [[Held(shard_key(0, 2), 9)], [Held(shard_key(1, 2), 9)], []]
    decided = plan(held, sharded=True)
    assert decided.step is None and "cut for 2 rank(s), not 3" in decided.reason


def test_a_newer_disk_checkpoint_wins_and_nothing_live_says_so() -> None:
    decided = plan([replicated(4), replicated(4)], sharded=False, disk_step=10)
    assert decided.step is None and "disk checkpoint of step 10 is newer" in decided.reason
    assert plan([[], []], sharded=False).reason == "no rank holds a live snapshot"


def test_a_folder_lists_whole_snapshots_and_keeps_the_newest_two(tmp_path: Path) -> None:
    folder = SnapshotFolder(tmp_path)
    for step in (1, 2, 3):

        def save(path: Path, step: int = step) -> None:
            path.write_text(str(step))

        folder.write(REPLICATED, step, save)
    (tmp_path / REPLICATED / ".step-00000004.pt.123.part").write_text("torn")
    assert folder.held() == replicated(2, 3)
    assert KEEP == 2
    assert folder.path(REPLICATED, 3).read_text() == "3"


def test_a_write_that_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    folder = SnapshotFolder(tmp_path)

    def fail(path: Path) -> None:
        path.write_text("half")
        raise OSError("no space left on device")

    with pytest.raises(OSError, match="no space"):
        folder.write(REPLICATED, 1, fail)
    assert folder.held() == []
    assert list((tmp_path / REPLICATED).iterdir()) == []


def test_a_resume_drops_the_snapshots_of_a_future_that_did_not_happen(tmp_path: Path) -> None:
    folder = SnapshotFolder(tmp_path)
    for key, step in [(REPLICATED, 5), (REPLICATED, 6), (shard_key(1, 2), 6)]:

        def save(path: Path) -> None:
            path.write_text("state")

        folder.write(key, step, save)
    assert folder.drop_after(5) == [Held(REPLICATED, 6), Held(shard_key(1, 2), 6)]
    assert folder.held() == [Held(REPLICATED, 5)]
    assert folder.drop_after(None) == [Held(REPLICATED, 5)]  # a fresh start: none stays
    assert folder.held() == []


def test_a_write_killed_with_its_rank_is_swept_and_a_live_one_is_not(tmp_path: Path) -> None:
    folder = SnapshotFolder(tmp_path)
    (tmp_path / REPLICATED).mkdir()
    gone = tmp_path / REPLICATED / ".step-00000007.pt.999999999.part"
    gone.write_text("half")
    live = tmp_path / REPLICATED / f".step-00000008.pt.{os.getpid()}.part"
    live.write_text("being written")

    assert folder.sweep() == [gone]
    assert live.exists() and not gone.exists()
