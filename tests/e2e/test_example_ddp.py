"""The DDP example (examples/ddp/train.py) trains, checkpoints and resumes bit for bit.

Every run is two real worker processes on gloo/CPU, started the way torchrun starts them
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), with real
``torch.distributed.checkpoint`` files in a temporary folder. Rank 0 prints
``params-sha256`` of its parameters' bytes next to ``params-sum``, so "same result" here
means bitwise identical, not close.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "ddp" / "train.py"
WORLD = 2
RUN_SECONDS = 90

pytestmark = pytest.mark.e2e

# Runs the script with `resurge` unimportable (a None entry makes `import resurge` raise
# ImportError), as on a machine where resurge is not installed.
WITHOUT_RESURGE = (
    "import runpy, sys; sys.modules['resurge'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


@dataclass
class Finished:
    outputs: list[str]  # stdout and stderr of each rank, by rank

    @property
    def rank0(self) -> list[str]:
        return self.outputs[0].splitlines()

    def value(self, key: str) -> str:
        values = [line.split(" ", 1)[1] for line in self.rank0 if line.startswith(key + " ")]
        assert len(values) == 1, f"expected one {key!r} line:\n{self.outputs[0]}"
        return values[0]

    def logged_steps(self) -> list[int]:
        return [int(line.split()[1]) for line in self.rank0 if line.startswith("step ")]

    def start_lines(self) -> list[str]:
        return [
            line
            for rank, output in enumerate(self.outputs)
            for line in output.splitlines()
            if line.startswith(f"rank {rank}/{WORLD}: ")
        ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_env(rank: int, port: int, extra: dict[str, str]) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RESURGE_", "TORCHELASTIC_"))
        and key not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
    }
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def start(
    log_dir: Path,
    args: Sequence[str],
    env: dict[str, str] | None = None,
    prefix: Sequence[str] = (),
    rank0_stdout: int | None = None,
) -> list[subprocess.Popen[str]]:
    """Start both ranks; their output goes to log_dir/rank<N>.log (rank 0's to a pipe if asked)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for rank in range(WORLD):
        out = rank0_stdout if rank == 0 and rank0_stdout is not None else None
        with (log_dir / f"rank{rank}.log").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, *prefix, str(SCRIPT), *args],
                    env=worker_env(rank, port, env or {}),
                    cwd=log_dir,
                    stdout=out if out is not None else log,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
    return procs


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def train(
    log_dir: Path,
    args: Sequence[str],
    env: dict[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> Finished:
    """Run both ranks to the end; fail unless every rank exits 0."""
    procs = start(log_dir, args, env, prefix)
    try:
        codes = [proc.wait(timeout=RUN_SECONDS) for proc in procs]
    finally:
        stop(procs)
    outputs = [(log_dir / f"rank{rank}.log").read_text() for rank in range(WORLD)]
    assert codes == [0] * WORLD, "\n".join(outputs)
    return Finished(outputs)


def checkpoints(directory: Path) -> dict[str, bool]:
    """step-NNNNNNNN folder name -> complete (has DCP's .metadata)."""
    return {p.name: (p / ".metadata").is_file() for p in sorted(directory.glob("step-*"))}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Finished, Path]:
    """20 steps uninterrupted, a checkpoint every 5."""
    root = tmp_path_factory.mktemp("full")
    ckpt = root / "ckpt"
    return (
        train(root, ["--steps", "20", "--checkpoint-every", "5", "--checkpoint-dir", str(ckpt)]),
        ckpt,
    )


@pytest.fixture(scope="module")
def first_half(tmp_path_factory: pytest.TempPathFactory) -> tuple[Finished, Path]:
    """The same job stopped after its step-10 checkpoint."""
    root = tmp_path_factory.mktemp("half")
    ckpt = root / "ckpt"
    return (
        train(root, ["--steps", "10", "--checkpoint-every", "5", "--checkpoint-dir", str(ckpt)]),
        ckpt,
    )


def test_uninterrupted_run_finishes_and_checkpoints_every_k_steps(
    full_run: tuple[Finished, Path],
) -> None:
    result, ckpt = full_run
    assert result.value("final") == "step 20"
    assert checkpoints(ckpt) == {f"step-{s:08d}": True for s in (5, 10, 15, 20)}
    assert result.start_lines() == [
        f"rank {r}/{WORLD}: starting fresh at step 1 (resurge: no agent)" for r in range(WORLD)
    ]
    assert re.fullmatch(r"-?\d+\.\d{6}", result.value("params-sum"))
    steps = result.logged_steps()
    assert steps[0] == 1 and steps[-1] == 20
    losses = {
        int(line.split()[1]): float(line.split()[3]) for line in result.rank0 if "loss" in line
    }
    assert losses[20] < losses[1]  # it does learn


def test_resume_from_resurge_checkpoint_is_bitwise_identical(
    full_run: tuple[Finished, Path], first_half: tuple[Finished, Path], tmp_path: Path
) -> None:
    full, _ = full_run
    half, half_ckpt = first_half
    assert half.value("final") == "step 10"
    assert checkpoints(half_ckpt) == {"step-00000005": True, "step-00000010": True}
    assert half.value("params-sha256") != full.value("params-sha256")

    # A fresh checkpoint folder: only the env var can say where to resume from.
    resume = half_ckpt / "step-00000010"
    result = train(
        tmp_path,
        ["--steps", "20", "--checkpoint-every", "5", "--checkpoint-dir", str(tmp_path / "c")],
        env={"RESURGE_RESUME_CHECKPOINT": str(resume), "RESURGE_RESUME_STEP": "10"},
    )
    assert result.start_lines() == [
        f"rank {r}/{WORLD}: resuming from {resume} at step 11 (resurge: no agent)"
        for r in range(WORLD)
    ]
    assert result.logged_steps()[0] == 11
    assert checkpoints(tmp_path / "c") == {"step-00000015": True, "step-00000020": True}
    assert result.value("final") == "step 20"
    assert result.value("params-sum") == full.value("params-sum")
    assert result.value("params-sha256") == full.value("params-sha256")


def test_without_resurge_env_resumes_from_newest_complete_checkpoint(
    full_run: tuple[Finished, Path], first_half: tuple[Finished, Path], tmp_path: Path
) -> None:
    full, _ = full_run
    _, half_ckpt = first_half
    ckpt = tmp_path / "ckpt"
    shutil.copytree(half_ckpt, ckpt)
    # A newer save that died before DCP wrote .metadata: must be skipped, then overwritten.
    (ckpt / "step-00000015").mkdir()
    (ckpt / "step-00000015" / "__0_0.distcp").write_bytes(b"torn")
    (ckpt / "step-00000099").write_text("a file, not a checkpoint")

    result = train(
        tmp_path, ["--steps", "20", "--checkpoint-every", "5", "--checkpoint-dir", str(ckpt)]
    )
    assert result.start_lines() == [
        f"rank {r}/{WORLD}: resuming from {ckpt / 'step-00000010'} at step 11 (resurge: no agent)"
        for r in range(WORLD)
    ]
    assert checkpoints(ckpt) == {
        "step-00000005": True,
        "step-00000010": True,
        "step-00000015": True,
        "step-00000020": True,
        "step-00000099": False,
    }
    assert result.value("params-sha256") == full.value("params-sha256")


def test_under_resurge_without_resume_checkpoint_starts_fresh(
    first_half: tuple[Finished, Path], tmp_path: Path
) -> None:
    """resurge decides: generation g with no resume checkpoint ignores what lies in the folder."""
    half, half_ckpt = first_half
    ckpt = tmp_path / "ckpt"
    shutil.copytree(half_ckpt, ckpt)
    result = train(
        tmp_path,
        ["--steps", "10", "--checkpoint-every", "5", "--checkpoint-dir", str(ckpt)],
        env={"RESURGE_GENERATION": "1"},
    )
    assert result.start_lines() == [
        f"rank {r}/{WORLD}: starting fresh at step 1 (resurge: no agent)" for r in range(WORLD)
    ]
    assert result.value("params-sha256") == half.value("params-sha256")


def test_runs_without_resurge_installed(first_half: tuple[Finished, Path], tmp_path: Path) -> None:
    """The local stand-in still reads RESURGE_RESUME_CHECKPOINT; checkpoints still work."""
    half, half_ckpt = first_half
    resume = half_ckpt / "step-00000005"
    result = train(
        tmp_path,
        ["--steps", "10", "--checkpoint-every", "5", "--checkpoint-dir", str(tmp_path / "c")],
        env={"RESURGE_RESUME_CHECKPOINT": str(resume), "RESURGE_RESUME_STEP": "5"},
        prefix=["-c", WITHOUT_RESURGE],
    )
    assert result.start_lines() == [
        f"rank {r}/{WORLD}: resuming from {resume} at step 6 (resurge: not installed)"
        for r in range(WORLD)
    ]
    assert checkpoints(tmp_path / "c") == {"step-00000010": True}
    assert result.value("final") == "step 10"
    assert result.value("params-sha256") == half.value("params-sha256")


def test_a_dead_peer_makes_the_survivor_exit_instead_of_hanging(tmp_path: Path) -> None:
    procs = start(
        tmp_path,
        ["--steps", "100000", "--step-seconds", "0.01", "--checkpoint-every", "0"],
        rank0_stdout=subprocess.PIPE,
    )
    try:
        rank0 = procs[0]
        assert rank0.stdout is not None
        seen = []
        for line in rank0.stdout:  # blocks until rank 0 has trained a few steps together
            seen.append(line)
            if line.startswith("step 10 "):
                break
        assert seen and seen[-1].startswith("step 10 "), "".join(seen)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        rest, _ = rank0.communicate(timeout=RUN_SECONDS)  # reads on: rank 0 never blocks
        elapsed = time.monotonic() - killed
        code = rank0.returncode
    finally:
        stop(procs)
    assert code != 0, rest
    assert "final step" not in rest
    assert elapsed < 60, f"rank 0 took {elapsed:.1f} s to notice"
