"""Protected state (resurge.worker.protect) across real processes: two gloo ranks, each with
a snapshot folder of its own (two nodes' memory), stopped mid-run and started again.

- Replicated (DDP): after rank 1's node lost its memory, rank 1 receives the step from
  rank 0 and the run ends with the parameters (and BatchNorm's running statistics) of an
  uninterrupted run, bit for bit, each rank drawing on from its own random stream.
- Sharded (a model per rank, and FSDP2's shards of one model, DTensors made local in the
  snapshot and DTensors again on load): each rank takes its own shard back; a node whose memory is
  gone gets its shard from its buddy's copy; with the copy gone too, nobody resumes from
  a live step (no mixed resume).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("protected_worker.py")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ranks(memory: Path, steps: int, stop_at: int, layout: str, world: int = 2) -> list[str]:
    """Run ``world`` ranks (rank r's node memory ``memory/node-<r>``) to the end; each
    one's output."""
    port = free_port()
    processes = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "RESURGE_SNAPSHOT_DIR": str(memory / f"node-{rank}"),
        }
        args = [sys.executable, str(WORKER), str(steps), str(stop_at), layout]
        processes.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    codes = [process.returncode for process in processes]
    assert codes == [3 if stop_at else 0] * world, outputs
    return outputs


def line(output: str, word: str) -> str:
    [found] = [text for text in output.splitlines() if text.startswith(word + " ")]
    return found.removeprefix(word + " ")


@pytest.mark.parametrize("layout", ["replicated", "sharded", "fsdp"])
def test_a_restart_resumes_from_the_live_step_bit_for_bit(tmp_path: Path, layout: str) -> None:
    plain = ranks(tmp_path / "plain", 10, 0, layout)
    ranks(tmp_path / "memory", 10, 6, layout)
    again = ranks(tmp_path / "memory", 10, 0, layout)

    assert [line(out, "digest") for out in again] == [line(out, "digest") for out in plain]
    assert [line(out, "drawn") for out in again] == [line(out, "drawn") for out in plain]
    for output in again:
        assert "step=6, source='memory'" in line(output, "restored")


def test_a_rank_whose_node_lost_its_memory_gets_the_step_from_its_peer(tmp_path: Path) -> None:
    plain = ranks(tmp_path / "plain", 10, 0, "replicated")
    ranks(tmp_path / "memory", 10, 6, "replicated")
    shutil.rmtree(tmp_path / "memory" / "node-1")
    again = ranks(tmp_path / "memory", 10, 0, "replicated")

    assert [line(out, "digest") for out in again] == [line(out, "digest") for out in plain]
    assert "step=6, source='memory'" in line(again[0], "restored")
    assert "step=6, source='peer', detail=\"step 6 from rank 0's memory\"" in line(
        again[1], "restored"
    )


@pytest.mark.parametrize("layout", ["sharded", "fsdp"])
def test_a_lost_node_s_shard_comes_back_from_its_buddy_s_copy(tmp_path: Path, layout: str) -> None:
    plain = ranks(tmp_path / "plain", 10, 0, layout)
    ranks(tmp_path / "memory", 10, 6, layout)
    held_by_rank_0 = sorted(p.name for p in (tmp_path / "memory" / "node-0").iterdir())
    shutil.rmtree(tmp_path / "memory" / "node-1")
    again = ranks(tmp_path / "memory", 10, 0, layout)

    assert held_by_rank_0 == ["shard-0-of-2", "shard-1-of-2"]  # its own and its ward's
    assert [line(out, "digest") for out in again] == [line(out, "digest") for out in plain]
    assert "source='memory'" in line(again[0], "restored")
    assert "source='peer'" in line(again[1], "restored")


@pytest.mark.parametrize("world", [1, 3])
def test_fsdp_shards_are_cut_again_from_memory_for_a_shrink_and_a_grow(
    tmp_path: Path, world: int
) -> None:
    stopped = ranks(tmp_path / "memory", 10, 6, "fsdp")
    # 2 -> 1: node 0 holds both shards (its own and its buddy copy of rank 1's).
    # 2 -> 3: rank 2's node is new; it receives both shards from ranks 0 and 1.
    again = ranks(tmp_path / "memory", 10, 0, "fsdp", world=world)

    # The parameters and the optimizer state are one whole; the BatchNorm statistics, which
    # FSDP leaves unsharded, are each rank's own: a re-cut takes rank 0's, as DCP would.
    whole_at_6 = line(stopped[0], "stopped")
    for rank, output in enumerate(again):
        restored = line(output, "restored")
        assert "step=6" in restored and "re-cut from 2 shards" in restored, restored
        assert ("source='peer'" if rank == 2 else "source='memory'") in restored, restored
        # The whole model and optimizer state after the re-cut are those of step 6.
        assert line(output, "resumed") == whole_at_6
        assert line(output, "digest")  # and it trained on to step 10
    if world == 3:
        assert "2 from peers, 0 in this node's memory" in line(again[2], "restored")


def test_a_shard_lost_with_its_buddy_s_copy_resumes_nobody_from_memory(tmp_path: Path) -> None:
    ranks(tmp_path / "memory", 10, 6, "sharded")
    shutil.rmtree(tmp_path / "memory" / "node-1")
    shutil.rmtree(tmp_path / "memory" / "node-0" / "shard-1-of-2")  # the buddy's node too
    again = ranks(tmp_path / "memory", 10, 0, "sharded")

    for output in again:
        restored = line(output, "restored")
        assert "source='start'" in restored and "lacks shards [1]" in restored


def test_a_snapshot_that_cannot_be_kept_is_said_and_training_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from resurge import worker

    # A folder that cannot exist stands for a node memory that is full (ENOSPC and
    # ENOTDIR are both OSErrors of the write).
    monkeypatch.setenv("RESURGE_SNAPSHOT_DIR", "/dev/null/memory")
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = worker.connect().protect(model=model, optimizer=optimizer)
    for step in (1, 2):
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()  # waits for the snapshot before: it must not raise
        assert state.snapshot(step)
    state.close()

    assert "the snapshot of step 1 was not kept" in capsys.readouterr().err
    assert state.costs.bytes == 0 and state.costs.call_seconds > 0


def test_what_a_snapshot_costs_is_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from resurge import worker

    monkeypatch.setenv("RESURGE_SNAPSHOT_DIR", str(tmp_path / "memory"))
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.Adam(model.parameters())
    state = worker.connect().protect(model=model, optimizer=optimizer)
    model(torch.ones(1, 256)).sum().backward()
    optimizer.step()
    assert state.snapshot(1)
    optimizer.step()  # waits for the write of step 1
    state.close()

    written = (tmp_path / "memory" / "replicated" / "step-00000001.snap").stat().st_size
    assert state.costs.bytes == written > 3 * 256 * 256 * 4  # parameters and Adam's two
    assert state.costs.call_seconds > 0 and state.costs.write_seconds > 0
    assert state.costs.waited_seconds >= 0


def test_a_memory_budget_keeps_fewer_snapshots_then_refuses_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from resurge import worker

    def trained(budget: int, steps: int) -> tuple[Any, list[int]]:
        folder = tmp_path / f"memory-{budget}"
        monkeypatch.setenv("RESURGE_SNAPSHOT_DIR", str(folder))
        monkeypatch.setenv("RESURGE_SNAPSHOT_BUDGET_BYTES", str(budget))
        model = torch.nn.Linear(64, 64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        state = worker.connect().protect(model=model, optimizer=optimizer, rng=False)
        for step in range(1, steps + 1):
            model(torch.ones(1, 64)).sum().backward()
            optimizer.step()
            state.snapshot(step)
        state.close()
        kept = sorted(int(p.stem.removeprefix("step-")) for p in folder.glob("*/step-*.snap"))
        return state, kept

    size = trained(10**9, 1)[0].costs.bytes
    # Room for two and a half snapshots: the folder keeps two, not three, and goes on.
    state, kept = trained(size * 5 // 2, 5)
    assert kept == [4, 5] and state.costs.skipped == 0
    # Room for none: each one is refused, said once, counted; training goes on.
    state, kept = trained(size // 2, 3)
    assert kept == [] and state.costs.skipped == 3
    said = [line for line in capsys.readouterr().err.splitlines() if "was not kept" in line]
    assert len(said) == 1 and f"{size} bytes do not fit in the snapshot memory budget" in said[0]
