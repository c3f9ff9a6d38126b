"""`resurge convert` as a user runs it: the installed command, as a subprocess, no cluster."""

import subprocess
import sys
from pathlib import Path

from resurge.jobspec import load_job

BIN = Path(sys.executable).parent
DATA = Path(__file__).resolve().parents[1] / "data" / "hyperpod"
PRETRAIN = DATA / "pretrain_llama3_70b_p5.yaml"
ELASTIC = DATA / "elastic-training-job.yaml"
CONTAINER = "spec.replicaSpecs[0].template.spec.containers[0]"


def resurge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "resurge"), *args], capture_output=True, text=True, timeout=60, check=False
    )


def warned_paths(stderr: str) -> set[str]:
    prefix = "resurge convert: warning: "
    lines = [line.removeprefix(prefix) for line in stderr.splitlines() if line.startswith(prefix)]
    return {line.split(": ", 1)[0] for line in lines}


def test_convert_prints_a_job_that_loads_and_warns_by_path(tmp_path: Path) -> None:
    result = resurge("convert", str(PRETRAIN))
    assert result.returncode == 0, result.stderr
    out = tmp_path / "job.yaml"
    out.write_text(result.stdout)
    job = load_job(out)
    assert job.name == "username-llama3-pretrain"
    assert job.spec.replicas.min == 16 and job.spec.nproc_per_node == 8
    warned = warned_paths(result.stderr)
    assert {"metadata.annotations", "spec.runPolicy.cleanPodPolicy"} <= warned
    assert {f"{CONTAINER}.args", f"{CONTAINER}.volumeMounts"} <= warned
    assert "spec.replicaSpecs[0].template.spec.volumes" in warned
    assert "spec.replicaSpecs[0].template.spec.nodeSelector" in warned


def test_convert_writes_out_file(tmp_path: Path) -> None:
    out = tmp_path / "elastic.yaml"
    result = resurge("convert", str(ELASTIC), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    job = load_job(out)
    assert (job.spec.replicas.min, job.spec.replicas.max, job.spec.replicas.step) == (2, 8, 2)
    assert job.spec.command == ["python", "train.py"]
    assert f"{CONTAINER}.command" in warned_paths(result.stderr)


def test_convert_fails_with_2_naming_the_problem(tmp_path: Path) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {}\n")
    result = resurge("convert", str(pod))
    assert result.returncode == 2 and result.stdout == ""
    assert "not a HyperPodPyTorchJob" in result.stderr and "'Pod'" in result.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    result = resurge("convert", str(broken))
    assert result.returncode == 2 and "not valid YAML" in result.stderr
    template = DATA / "llama3_1_8b-fsdp-hpto.yaml"  # $GPU_PER_NODE not filled in
    result = resurge("convert", str(template))
    assert result.returncode == 2 and "spec.nprocPerNode" in result.stderr


def test_convert_help_says_what_it_does() -> None:
    result = resurge("convert", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "HyperPodPyTorchJob" in text and "--out FILE" in text
    assert "Exit status 0, with warnings or without; 2" in text
    assert "--state-dir" not in text  # it talks to no cluster
