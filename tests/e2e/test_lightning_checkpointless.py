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
- A checkpoint of step 6 given to ``fit(ckpt_path=...)`` is not loaded over step 9 live.
- On a local cluster (2 replicas x 1 rank), rank 1 SIGKILLed in the middle of an epoch:
  a process restart, both ranks take the step from their node's memory, at most the step
  in flight is trained again, and the run ends bit for bit as an uninterrupted one.

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

from resurge.control.effects.client import inject_fault
from resurge.events import JobPhase, Progress, RecoveryFinished, StateRestored
from resurge.local.demo import steps_lost
from resurge.local.job_factory import python_job
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus

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


def final_step(seen: list[Observed]) -> int:
    return max((o.event.step for o in seen if isinstance(o.event, Progress)), default=0)


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


def test_a_live_step_newer_than_the_checkpoint_given_to_fit_wins(
    tmp_path: Path, uninterrupted: list[str]
) -> None:
    disk = tmp_path / "step-6.ckpt"
    ranks(tmp_path, "--stop-at", "9", "--save-at", "6", "--save-to", str(disk), code=3)
    assert disk.is_file()
    again = ranks(tmp_path, "--ckpt-path", str(disk))

    for output, plain in zip(again, uninterrupted, strict=True):
        assert "step=9, source='memory'" in line(output, "restored")
        assert line(output, "trained") == f"10..{STEPS}"
        assert line(output, "digest") == line(plain, "digest")
    assert f"resuming from step 9, live in memory, not from the checkpoint at {disk}" in again[0]


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


def test_a_lightning_older_than_2_5_is_refused() -> None:
    """Lightning 2.4's fit loop, resumed from a state of on_train_batch_end, trains that
    batch again (measured: every test above ends with other parameters under 2.4.0)."""
    from resurge.integrations.lightning import _check_version

    with pytest.raises(RuntimeError, match=r"needs lightning 2\.5 or newer, not 2\.4\.0"):
        _check_version("2.4.0")
    for version in ("2.5.0", "2.6.6", "3.0.0rc1"):
        _check_version(version)


async def test_on_a_local_cluster_a_killed_rank_goes_on_from_the_step_of_the_fault(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    """2 replicas x 1 rank; rank 1 SIGKILLed past step 15 (the middle of epoch 2): the
    process restart trains at most the step in flight again, both ranks take the step
    from their own node's memory, and the run ends as an uninterrupted one, bit for bit."""
    steps = ["--steps", "30", "--step-seconds", "0.2"]
    reference = {line(out, "digest") for out in ranks(tmp_path / "plain", "--plain", *steps)}
    job = python_job(
        "lightning-memory", WORKER, *steps, nproc=1, replicas=2, preload=["lightning"],
        env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip

    async def kill(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(lambda seen: final_step(seen) >= 15, wait_seconds=180)
        await inject_fault(bus, job.name, 1, "crash")

    result = await run_job(
        job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=1, wait_seconds=300, during=kill, cwd=tmp_path,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    [lost] = steps_lost(result)
    assert 0 <= lost <= 1, f"{lost} step(s) trained again"
    [recovery] = [e for e in result.events(RecoveryFinished) if isinstance(e, RecoveryFinished)]
    print(f"steps trained again: {lost}; recovery: {recovery.duration_seconds:.2f} s")
    restored = {e.rank: e.origin for e in result.events(StateRestored) if e.generation == 1}
    assert restored == {0: "memory", 1: "memory"}, result.events(StateRestored)
    digests = {
        text.rsplit("digest ", 1)[1].split()[0]
        for log in (tmp_path / "logs").glob("*.log")
        for text in log.read_text(errors="replace").splitlines()
        if "digest " in text
    }
    assert digests == reference
