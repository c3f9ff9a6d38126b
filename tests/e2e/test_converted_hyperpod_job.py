"""A HyperPod manifest, converted by `resurge convert`, runs on a local cluster as it ran
under HyperPod.

The manifest has the shape of AWS's published ones (tests/data/hyperpod/
pretrain_llama3_70b_p5.yaml): env values that refer to each other with ``$(VAR)``, and a
shell script that prepares a folder, reads ``NNODES`` and starts the training script
with ``hyperpodrun``. The training script is a plain torchrun-style one that never
imports resurge (tests/e2e/workers/plain_ddp.py). 2 nodes x 2 ranks: each rank records
what its shell saw, and the job must succeed with one world of 4. Before, the shell
script kept ``hyperpodrun`` (not installed: every worker failed, and under HyperPod's
agent it would have started 2 workers per worker), ``$(ROOT)`` stayed as written and
``NNODES`` was empty.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import yaml

from resurge.events import JobPhase, RendezvousPassed
from resurge.jobspec import load_job
from resurge.local.story import run_job

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
PLAIN = Path(__file__).parent / "workers" / "plain_ddp.py"
SCRIPT = f"""mkdir -p "${{SEEN}}" && \\
echo "${{NNODES}} ${{RUN_DIR}}" > "${{SEEN}}/rank-${{RANK}}" && \\

hyperpodrun --nproc_per_node=2 \\
  --tee 3 \\
  --log_dir "${{SEEN}}" \\
  {PLAIN} --steps 20 --step-seconds 0.01 2>&1
"""


def manifest(root: Path) -> dict[str, object]:
    env = {
        "ROOT": str(root),
        "JOB_NAME": "converted",
        "SEEN": "$(ROOT)/seen",
        "RUN_DIR": "$(ROOT)/runs/$(JOB_NAME)",
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",  # `python` is this one
        "OMP_NUM_THREADS": "1",
    }
    container = {
        "name": "pytorch",
        "command": ["/bin/sh"],
        "args": ["-c", SCRIPT],
        "env": [{"name": name, "value": value} for name, value in env.items()],
    }
    return {
        "apiVersion": "sagemaker.amazonaws.com/v1",
        "kind": "HyperPodPyTorchJob",
        "metadata": {"name": "converted"},
        "spec": {
            "nprocPerNode": "2",
            "replicaSpecs": [
                {"name": "pods", "replicas": 2, "template": {"spec": {"containers": [container]}}}
            ],
        },
    }


async def test_a_converted_manifest_runs_as_under_hyperpod(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    source = tmp_path / "hyperpod.yaml"
    source.write_text(yaml.safe_dump(manifest(tmp_path)))
    converted = tmp_path / "job.yaml"
    conversion = await asyncio.create_subprocess_exec(
        str(BIN / "resurge"), "convert", str(source), "--out", str(converted),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, warnings = await asyncio.wait_for(conversion.communicate(), timeout=60)
    assert conversion.returncode == 0, warnings.decode()
    job = load_job(converted)

    result = await run_job(
        job, state_dir=tmp_path / "state", nats_url=nats_url, namespace=namespace, nodes=2,
        gpus_per_node=2, wait_seconds=240, cwd=tmp_path,
    )  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    seen = {path.name: path.read_text().strip() for path in (tmp_path / "seen").iterdir()}
    assert seen == {f"rank-{rank}": f"2 {tmp_path}/runs/converted" for rank in range(4)}
    passed = [e for e in result.events(RendezvousPassed) if isinstance(e, RendezvousPassed)]
    assert passed and {e.world_size for e in passed} == {4}
