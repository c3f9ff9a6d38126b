"""The resume rule of checkpointless recovery (resurge.worker.live_copy.plan): one step for
every rank, the newest whose state is complete among them, or the disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resurge.worker.live_copy import REPLICATED, Held, plan, shard_key
from resurge.worker.snapshot_folder import KEEP, OverBudget, SnapshotFolder


def replicated(*steps: int) -> list[Held]:
    return [Held(REPLICATED, step) for step in steps]


def test_replicated_state_resumes_at_the_newest_step_anyone_holds() -> None:
    # Rank 1 is new (its node was lost); rank 0 wrote step 7 before the fault, rank 2 not yet.
    decided = plan([replicated(6, 7), [], replicated(5, 6)], sharded=False)
    assert decided.step == 7
    assert decided.sources == {
        0: [(REPLICATED, None)],
        1: [(REPLICATED, 0)],
        2: [(REPLICATED, 0)],
    }
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
    assert decided.step == 7 and decided.sources[2] == [(shard_key(2, 3), 0)]
    # Its node and its buddy both lost: no complete step, the disk.
    decided = plan([shards(0, 7, 8), shards(1, 7, 8), []], sharded=True)
    assert decided.step is None and "lacks shards [2]" in decided.reason


def test_shards_cut_for_another_world_size_fall_back_to_the_disk_unless_reshardable() -> None:
    held = [[Held(shard_key(0, 2), 9)], [Held(shard_key(1, 2), 9)], []]
    decided = plan(held, sharded=True)
    assert decided.step is None and "cut for 2 rank(s), not 3" in decided.reason
    assert "cannot be cut again" in decided.reason

    # A grow 2 -> 3 of DTensor shards: every rank gets both old shards, in order.
    decided = plan(held, sharded=True, reshardable=True)
    assert decided.step == 9 and decided.cut_from == 2
    assert decided.sources == {
        0: [(shard_key(0, 2), None), (shard_key(1, 2), 1)],
        1: [(shard_key(0, 2), 0), (shard_key(1, 2), None)],
        2: [(shard_key(0, 2), 0), (shard_key(1, 2), 1)],
    }
    assert decided.sends(1) == [(shard_key(1, 2), 0), (shard_key(1, 2), 2)]
    assert "re-cut for 3" in decided.reason


def test_a_shrink_re_cuts_from_a_buddy_copy_and_this_world_wins_a_tie() -> None:
    # 3 -> 2: rank 2's node is gone; rank 0 holds its buddy copy of shard 2 of step 9.
    old = [
        [Held(shard_key(0, 3), 9), Held(shard_key(2, 3), 9)],
        [Held(shard_key(1, 3), 8), Held(shard_key(1, 3), 9)],
    ]
    decided = plan(old, sharded=True, reshardable=True)
    assert decided.step == 9 and decided.cut_from == 3
    assert decided.sources[1] == [
        (shard_key(0, 3), 0),
        (shard_key(1, 3), None),
        (shard_key(2, 3), 0),
    ]
    # Step 9 complete both at 3 ranks and at this world's 2: its own shards, nothing moves.
    both = [old[0] + [Held(shard_key(0, 2), 9)], old[1] + [Held(shard_key(1, 2), 9)]]
    decided = plan(both, sharded=True, reshardable=True)
    assert decided.cut_from is None and decided.sources[1] == [(shard_key(1, 2), None)]
    # A newer step at the old size beats an older one at this size.
    newer = [old[0] + [Held(shard_key(0, 2), 8)], old[1] + [Held(shard_key(1, 2), 8)]]
    assert plan(newer, sharded=True, reshardable=True).cut_from == 3


def test_a_newer_disk_checkpoint_wins_and_nothing_live_says_so() -> None:
    decided = plan([replicated(4), replicated(4)], sharded=False, disk_step=10)
    assert decided.step is None and "disk checkpoint of step 10 is newer" in decided.reason
    assert plan([[], []], sharded=False).reason == "no rank holds a live snapshot"


def test_a_folder_lists_whole_snapshots_and_keeps_the_newest_three(tmp_path: Path) -> None:
    folder = SnapshotFolder(tmp_path)
    for step in (1, 2, 3, 4):

        def save(path: Path, step: int = step) -> None:
            path.write_text(str(step))

        folder.write(REPLICATED, step, save)
    (tmp_path / REPLICATED / ".step-00000005.snap.123.part").write_text("torn")
    assert folder.held() == replicated(2, 3, 4)
    assert KEEP == 3
    assert folder.path(REPLICATED, 4).read_text() == "4"


def test_a_new_snapshot_is_written_over_the_oldest_while_the_two_before_it_stay(
    tmp_path: Path,
) -> None:
    folder = SnapshotFolder(tmp_path)
    for step in (1, 2, 3):
        folder.write(REPLICATED, step, lambda path: path.write_text("old"))
    recycled = folder.path(REPLICATED, 1).stat().st_ino
    seen: list[tuple[int, list[Held], str]] = []

    def save(path: Path) -> None:
        seen.append((path.stat().st_ino, folder.held(), path.read_text()))
        path.write_text("4")

    folder.write(REPLICATED, 4, save)
    # The oldest file's own inode (its pages) takes step 4; steps 2 and 3 stay whole.
    assert seen == [(recycled, replicated(2, 3), "old")]
    assert folder.path(REPLICATED, 4).stat().st_ino == recycled
    assert folder.held() == replicated(2, 3, 4)


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
    gone = tmp_path / REPLICATED / ".step-00000007.snap.999999999.part"
    gone.write_text("half")
    live = tmp_path / REPLICATED / f".step-00000008.snap.{os.getpid()}.part"
    live.write_text("being written")

    assert folder.sweep() == [gone]
    assert live.exists() and not gone.exists()


def test_a_budget_drops_older_snapshots_first_then_refuses_naming_the_sizes(
    tmp_path: Path,
) -> None:
    folder = SnapshotFolder(tmp_path, budget=250)
    for step in (1, 2):
        folder.write(REPLICATED, step, lambda path: path.write_bytes(b"r" * 100), 100)
    folder.write(shard_key(0, 2), 2, lambda path: path.write_bytes(b"b" * 40), 40)  # a buddy's
    assert folder.used() == 240

    # 100 more do not fit beside 240: step 1 goes, the newest (2) stays whole.
    folder.write(REPLICATED, 3, lambda path: path.write_bytes(b"r" * 100), 100)
    assert folder.held() == [Held(REPLICATED, 2), Held(shard_key(0, 2), 2), Held(REPLICATED, 3)]

    with pytest.raises(OverBudget, match=r"120 bytes do not fit .* budget of 250 bytes"):
        folder.write(REPLICATED, 4, lambda path: path.write_bytes(b"r" * 120), 120)
    # Nothing half-written, and the newest whole snapshot is still there.
    assert folder.held()[-1] == Held(REPLICATED, 3)
    assert not list((tmp_path / REPLICATED).glob(".*.part"))
    with pytest.raises(ValueError, match="size"):
        folder.write(REPLICATED, 5, lambda path: path.write_bytes(b""))


def test_the_shards_of_a_world_before_a_resize_go_once_the_new_world_holds_newer(
    tmp_path: Path,
) -> None:
    folder = SnapshotFolder(tmp_path)

    def save(path: Path) -> None:
        path.write_text("state")

    for key in (shard_key(0, 2), shard_key(1, 2), "rng-0-of-2"):
        folder.write(key, 9, save)
    # Resized to 3 ranks at step 9: the old cut stays while it may still be the newest.
    for step in (10, 11):
        folder.write(shard_key(0, 3), step, save)
        assert {h.key for h in folder.held()} >= {shard_key(1, 2), "rng-0-of-2"}
    folder.write(shard_key(0, 3), 12, save)
    assert {h.key for h in folder.held()} == {shard_key(0, 3)}
