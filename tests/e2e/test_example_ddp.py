"""The DDP example (examples/ddp/train.py) trains, checkpoints and resumes bit for bit, and
keeps its global batch at any world size.

Every run is real worker processes (two unless a test says otherwise) on gloo/CPU,
started the way torchrun starts them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), with real ``torch.distributed.checkpoint`` files in a
temporary folder. Rank 0 prints ``params-sha256`` of its parameters' bytes next to
``params-sum``, so "same result" at one world size means bitwise identical, not close.
Across world sizes the gradients are summed in another order, so there "same" means
every tensor of the checkpoints (model and optimizer) passes ``torch.allclose`` with
``rtol=1e-5, atol=1e-6`` (the differences seen are about 1e-7), and every printed loss
(6 decimals) is within 2e-6.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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
    world: int = field(default=WORLD)

    @property
    def rank0(self) -> list[str]:
        return self.outputs[0].splitlines()

    def value(self, key: str) -> str:
        values = [line.split(" ", 1)[1] for line in self.rank0 if line.startswith(key + " ")]
        assert len(values) == 1, f"expected one {key!r} line:\n{self.outputs[0]}"
        return values[0]

    def logged_steps(self) -> list[int]:
        return [int(line.split()[1]) for line in self.rank0 if line.startswith("step ")]

    def losses(self) -> dict[int, float]:
        """step -> the loss rank 0 printed for it (the global batch's mean)."""
        return {
            int(line.split()[1]): float(line.split()[3])
            for line in self.rank0
            if line.startswith("step ")
        }

    def start_lines(self) -> list[str]:
        return [
            line
            for rank, output in enumerate(self.outputs)
            for line in output.splitlines()
            if line.startswith(f"rank {rank}/{self.world}: ")
        ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_env(rank: int, port: int, extra: dict[str, str], world: int = WORLD) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RESURGE_", "TORCHELASTIC_"))
        and key not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
    }
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
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
    world: int = WORLD,
) -> list[subprocess.Popen[str]]:
    """Start every rank; their output goes to log_dir/rank<N>.log (rank 0's to a pipe if asked)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for rank in range(world):
        out = rank0_stdout if rank == 0 and rank0_stdout is not None else None
        with (log_dir / f"rank{rank}.log").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, *prefix, str(SCRIPT), *args],
                    env=worker_env(rank, port, env or {}, world),
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
    world: int = WORLD,
) -> Finished:
    """Run every rank to the end; fail unless every rank exits 0."""
    codes, outputs = finish(start(log_dir, args, env, prefix, world=world), log_dir)
    assert codes == [0] * world, "\n".join(outputs)
    return Finished(outputs, world)


def finish(procs: list[subprocess.Popen[str]], log_dir: Path) -> tuple[list[int], list[str]]:
    """Wait for every rank: the exit codes and the outputs, by rank."""
    try:
        codes = [proc.wait(timeout=RUN_SECONDS) for proc in procs]
    finally:
        stop(procs)
    return codes, [(log_dir / f"rank{rank}.log").read_text() for rank in range(len(procs))]


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


def test_a_dataloader_with_worker_processes_trains_on_the_same_samples(
    full_run: tuple[Finished, Path], first_half: tuple[Finished, Path], tmp_path: Path
) -> None:
    """--data-workers 2: each rank's samples come from 2 DataLoader processes, in order,
    from the resumed step on; the parameters end bitwise as without them."""
    full, _ = full_run
    _, half_ckpt = first_half
    resume = half_ckpt / "step-00000010"
    result = train(
        tmp_path,
        ["--steps", "20", "--checkpoint-every", "0", "--checkpoint-dir", str(tmp_path / "c"),
         "--data-workers", "2"],
        env={"RESURGE_RESUME_CHECKPOINT": str(resume), "RESURGE_RESUME_STEP": "10"},
    )  # fmt: skip
    assert result.logged_steps()[0] == 11
    assert result.value("final") == "step 20"
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


# The same global batch at world sizes 2 and 4: 2 ranks x 2 micro-batches of 16
# (accumulation) and 4 ranks x 1 micro-batch of 16.
ELASTIC = ["--steps", "20", "--checkpoint-every", "10", "--global-batch", "64"]
ELASTIC += ["--micro-batch", "16", "--log-every", "1"]
SPLITS = {
    1: "64 = 1 rank x 4 micro-batches of 16",
    2: "64 = 2 ranks x 2 micro-batches of 16",
    4: "64 = 4 ranks x 1 micro-batch of 16",
}

# Loads two DCP checkpoints (argv[1], argv[2]) whole and compares them: the same keys,
# every tensor torch.allclose, everything else equal. Exit 1 names what differs.
COMPARE_CHECKPOINTS = """
import os, sys, tempfile, torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

def flat(tree, prefix=""):
    if isinstance(tree, (dict, list, tuple)):
        pairs = tree.items() if isinstance(tree, dict) else enumerate(tree)
        for key, value in pairs:
            yield from flat(value, f"{prefix}{key}/")
    else:
        yield prefix.rstrip("/"), tree

def load(path):
    with tempfile.TemporaryDirectory() as folder:
        dcp_to_torch_save(path, os.path.join(folder, "state.pt"))
        return dict(flat(torch.load(os.path.join(folder, "state.pt"), weights_only=False)))

a, b = load(sys.argv[1]), load(sys.argv[2])
differ = sorted(set(a) ^ set(b)) + [
    key
    for key in sorted(set(a) & set(b))
    if not (
        torch.allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
        if isinstance(a[key], torch.Tensor)
        else a[key] == b[key]
    )
]
print(f"{len(a)} entries compared, differing: {differ}")
sys.exit(1 if differ or not any(key.startswith("model/") for key in a) else 0)
"""


def assert_checkpoints_close(first: Path, second: Path) -> None:
    compared = subprocess.run(
        [sys.executable, "-c", COMPARE_CHECKPOINTS, str(first), str(second)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
    )
    assert compared.returncode == 0, compared.stdout + compared.stderr


def assert_losses_close(result: Finished, reference: Finished, steps: range) -> None:
    losses, expected = result.losses(), reference.losses()
    assert sorted(losses) == list(steps)
    far = {
        step: (losses[step], expected[step])
        for step in steps
        if not math.isclose(losses[step], expected[step], rel_tol=0, abs_tol=2e-6)
    }
    assert not far, f"step: (loss, reference loss) {far}"


@pytest.fixture(scope="module")
def elastic_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Finished, Path]]:
    """20 uninterrupted steps of a 64-sample global batch at world sizes 2 and 4."""
    runs = {}
    for world in (2, 4):
        root = tmp_path_factory.mktemp(f"elastic{world}")
        ckpt = root / "ckpt"
        runs[world] = (
            train(root, [*ELASTIC, "--checkpoint-dir", str(ckpt)], world=world),
            ckpt,
        )
    return runs


def test_world_sizes_2_and_4_compute_the_same_steps(
    elastic_runs: dict[int, tuple[Finished, Path]],
) -> None:
    (two, ckpt2), (four, ckpt4) = elastic_runs[2], elastic_runs[4]
    for world, result in ((2, two), (4, four)):
        assert result.value("global-batch") == SPLITS[world]
        assert result.value("final") == "step 20"
    assert (
        checkpoints(ckpt2) == checkpoints(ckpt4) == {"step-00000010": True, "step-00000020": True}
    )
    assert_losses_close(four, two, range(1, 21))
    assert_checkpoints_close(ckpt4 / "step-00000020", ckpt2 / "step-00000020")


@pytest.mark.parametrize(("written", "resumed"), [(4, 2), (2, 4), (2, 2)])
def test_a_checkpoint_resumes_at_another_world_size(
    elastic_runs: dict[int, tuple[Finished, Path]], written: int, resumed: int, tmp_path: Path
) -> None:
    """It goes on from the checkpoint's step + 1 and ends where an uninterrupted run at the
    new size ends: within tolerance, and bitwise at the size it was written at."""
    resume = elastic_runs[written][1] / "step-00000010"
    reference, reference_ckpt = elastic_runs[resumed]
    result = train(
        tmp_path,
        [*ELASTIC, "--checkpoint-dir", str(tmp_path / "c")],
        env={"RESURGE_RESUME_CHECKPOINT": str(resume), "RESURGE_RESUME_STEP": "10"},
        world=resumed,
    )
    assert result.start_lines() == [
        f"rank {r}/{resumed}: resuming from {resume} at step 11 (resurge: no agent)"
        for r in range(resumed)
    ]
    assert result.value("global-batch") == SPLITS[resumed]
    assert result.value("final") == "step 20"
    assert checkpoints(tmp_path / "c") == {"step-00000020": True}
    assert_losses_close(result, reference, range(11, 21))
    assert_checkpoints_close(tmp_path / "c" / "step-00000020", reference_ckpt / "step-00000020")
    if written == resumed:
        assert result.value("params-sha256") == reference.value("params-sha256")


@pytest.mark.parametrize(
    ("world", "batch_args", "message"),
    [
        (4, ["--global-batch", "6"], "--global-batch 6 does not split evenly over WORLD_SIZE=4"),
        (2, ["--micro-batch", "24"], "not a whole number of --micro-batch 24 micro-batches"),
    ],
    ids=["global-batch", "micro-batch"],
)
def test_a_world_size_that_does_not_split_the_global_batch_is_refused(
    tmp_path: Path, world: int, batch_args: list[str], message: str
) -> None:
    codes, outputs = finish(
        start(tmp_path, ["--steps", "2", "--checkpoint-every", "0", *batch_args], world=world),
        tmp_path,
    )
    assert all(code != 0 for code in codes), outputs
    for output in outputs:
        assert "train.py: error: " in output and message in output, output
        assert "step 1 " not in output


# Calls the example's run_generation twice in one process, the way resurge's in-process
# restart does: rank 0 trains alone (WORLD_SIZE=1) to step 10, then joins WORLD_SIZE=2 on
# the port its environment names and resumes from its own step-10 checkpoint; rank 1
# only takes part in the second generation.
REENTER = """
import argparse, os, runpy, socket, sys
sys.argv = sys.argv[1:]
example = runpy.run_path(sys.argv[0])
args = example["parse_args"](sys.argv[1:])
if os.environ["RANK"] == "0":
    second = dict(os.environ)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    os.environ.update(WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_PORT=port)
    first = argparse.Namespace(**{**vars(args), "steps": 10})
    example["run_generation"](example["_NoOpRun"](), first, "re-entered")
    os.environ.clear()
    os.environ.update(second)
example["run_generation"](example["_NoOpRun"](), args, "re-entered")
"""


def test_an_in_process_re_entry_takes_the_new_world_size(
    elastic_runs: dict[int, tuple[Finished, Path]], tmp_path: Path
) -> None:
    reference, reference_ckpt = elastic_runs[2]
    ckpt = tmp_path / "ckpt"
    result = train(
        tmp_path,
        [*ELASTIC, "--checkpoint-dir", str(ckpt)],
        prefix=["-c", REENTER],
    )
    lines = [line for line in result.rank0 if line.startswith(("rank 0/", "global-batch", "final"))]
    assert lines == [
        "rank 0/1: starting fresh at step 1 (resurge: re-entered)",
        f"global-batch {SPLITS[1]}",
        "final step 10",
        f"rank 0/2: resuming from {ckpt / 'step-00000010'} at step 11 (resurge: re-entered)",
        f"global-batch {SPLITS[2]}",
        "final step 20",
    ]
    assert result.start_lines()[-1] == (
        f"rank 1/2: resuming from {ckpt / 'step-00000010'} at step 11 (resurge: re-entered)"
    )
    assert checkpoints(ckpt) == {"step-00000010": True, "step-00000020": True}
    assert_losses_close(result, reference, range(1, 21))
    assert_checkpoints_close(ckpt / "step-00000020", reference_ckpt / "step-00000020")
