"""PyTorch Lightning's resurge callback (resurge.integrations.lightning) across real
processes: a Lightning DDP script (tests/e2e/workers/lightning_checkpointless.py) on two
gloo ranks, each with a snapshot folder of its own (two nodes' memory), run as plain
processes with torchrun's environment (no cluster), stopped mid-epoch and started again.

- Stopped right after step 9 (the middle of epoch 1) and started again, both ranks go on
  from step 9 in their own node's memory: they train steps 10 to 16 only, end at the
  step and epoch of an uninterrupted run, and with its parameters bit for bit (dropout,
  Adam, a per-step lr schedule and the DistributedSampler's shuffled epochs included).
  The uninterrupted run is the script without the callback, which writes nothing.
- The same after rank 1's node lost its memory: rank 1 takes step 9 from rank 0.
- Stopped at the end of an epoch (step 12), the next epoch begins in its own order.

The callback needs resurge by definition: a script that never imports resurge is the
``--plain`` run (and tests/e2e/test_plain_script_faults.py on a cluster).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

WORKER = Path(__file__).parent / "workers" / "lightning_checkpointless.py"
STEPS = 16  # 6 batches per rank and epoch: epochs 0, 1 and two thirds of 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ranks(memory: Path, *args: str, code: int = 0) -> list[str]:
    """Run both ranks to their end; each one's output."""
    port = free_port()
    processes = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "TORCHELASTIC_RUN_ID": "lightning-checkpointless",
            "RANK": str(rank),
            "GROUP_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "RESURGE_SNAPSHOT_DIR": str(memory / f"node-{rank}"),
        }
        command = [sys.executable, str(WORKER), "--steps", str(STEPS), *args]
        processes.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [process.communicate(timeout=110)[0] for process in processes]
    assert [process.returncode for process in processes] == [code, code], outputs
    return outputs


def line(output: str, word: str) -> str:
    [found] = [text for text in output.splitlines() if text.startswith(word + " ")]
    return found.removeprefix(word + " ")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The script without the callback, run through: it writes no snapshot."""
    memory = tmp_path_factory.mktemp("plain")
    outputs = ranks(memory, "--plain")
    assert [path for path in memory.rglob("*") if path.is_file()] == []
    for output in outputs:
        assert line(output, "trained") == f"1..{STEPS}"
    return outputs


def test_a_restart_goes_on_from_the_step_in_memory_bit_for_bit(
    tmp_path: Path, uninterrupted: list[str]
) -> None:
    ranks(tmp_path, "--stop-at", "9", code=3)
    again = ranks(tmp_path)

    for output, plain in zip(again, uninterrupted, strict=True):
        assert "step=9, source='memory'" in line(output, "restored")
        assert line(output, "trained") == f"10..{STEPS}"
        assert line(output, "ended") == line(plain, "ended")
        assert line(output, "digest") == line(plain, "digest")


def test_a_rank_whose_node_lost_its_memory_gets_the_step_from_its_peer(
    tmp_path: Path, uninterrupted: list[str]
) -> None:
    ranks(tmp_path, "--stop-at", "9", code=3)
    shutil.rmtree(tmp_path / "node-1")
    again = ranks(tmp_path)

    assert "step=9, source='memory'" in line(again[0], "restored")
    assert "step=9, source='peer', detail=\"step 9 from rank 0's memory\"" in line(
        again[1], "restored"
    )
    for output, plain in zip(again, uninterrupted, strict=True):
        assert line(output, "trained") == f"10..{STEPS}"
        assert line(output, "digest") == line(plain, "digest")


def test_a_restart_at_the_end_of_an_epoch_begins_the_next(
    tmp_path: Path, uninterrupted: list[str]
) -> None:
    ranks(tmp_path, "--stop-at", "12", code=3)
    again = ranks(tmp_path)

    for output, plain in zip(again, uninterrupted, strict=True):
        assert "step=12, source='memory'" in line(output, "restored")
        assert line(output, "trained") == f"13..{STEPS}"
        assert line(output, "ended") == line(plain, "ended")
        assert line(output, "digest") == line(plain, "digest")
