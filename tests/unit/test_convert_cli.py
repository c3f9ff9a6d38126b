"""`resurge convert` as a user runs it: the installed command, as a subprocess, no cluster."""

import string
import subprocess
import sys
from pathlib import Path

import pytest

from resurge.jobspec import load_job

BIN = Path(sys.executable).parent
DATA = Path(__file__).resolve().parents[1] / "data" / "hyperpod"
PRETRAIN = DATA / "pretrain_llama3_70b_p5.yaml"
ELASTIC = DATA / "elastic-training-job.yaml"
CONTAINER = "spec.replicaSpecs[0].template.spec.containers[0]"
# The five published manifests (each names its source in its first lines); the FSDP one
# is an envsubst template, filled in as its README says before `kubectl apply`.
FSDP_VALUES = {
    "GPU_PER_NODE": "8",
    "NUM_NODES": "4",
    "EFA_PER_NODE": "32",
    "IMAGE_URI": "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp:pytorch2.5",
    "INSTANCE_TYPE": "ml.p5.48xlarge",
    "HF_TOKEN": "hf_example",
}
PUBLISHED = {
    "elastic-training-job.yaml": (2, 8, 8),
    "llama3_1_8b-fsdp-hpto.yaml": (4, 4, 8),
    "pretrain_llama3_70b_p5.yaml": (16, 16, 8),
    "full_finetune_gpt_oss_120b_checkpointless_p5.yaml": (16, 16, 8),
    "hyp-task-governance-team-a.yaml": (2, 2, 4),
}


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
    assert "--strict" in text and "exit status 1" in text.lower()
    assert "--state-dir" not in text  # it talks to no cluster


def published(name: str, tmp_path: Path) -> Path:
    if name != "llama3_1_8b-fsdp-hpto.yaml":
        return DATA / name
    filled = tmp_path / name
    filled.write_text(string.Template((DATA / name).read_text()).substitute(FSDP_VALUES))
    return filled


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_manifests_convert_end_to_end(name: str, tmp_path: Path) -> None:
    """Each converts into a job that loads; no launcher is left in its command (a
    direct one or one in a shell script); its warnings name manifest paths; its
    NNODES is set where its size is fixed; and --strict refuses it, as each has warnings."""
    manifest = published(name, tmp_path)
    out = tmp_path / "job.yaml"
    result = resurge("convert", str(manifest), "--out", str(out))
    assert result.returncode == 0, result.stderr
    job = load_job(out)
    spec = job.spec
    low, high, nproc = PUBLISHED[name]
    sizes = spec.replicas.allowed_sizes()
    assert (sizes[0], sizes[-1], spec.nproc_per_node) == (low, high, nproc)
    assert not any(launcher in " ".join(spec.command) for launcher in ("hyperpodrun", "torchrun"))
    assert not any("$(" in var.value for var in spec.env)
    env = {var.name: var.value for var in spec.env}
    assert env.get("NNODES") == (str(low) if low == high else None)
    warned = warned_paths(result.stderr)
    assert warned and all(path.startswith(("metadata.", "spec.")) for path in warned)
    strict = resurge("convert", "--strict", str(manifest), "--out", str(tmp_path / "no.yaml"))
    assert strict.returncode == 1 and not (tmp_path / "no.yaml").exists()
    assert warned_paths(strict.stderr) == warned
    assert "--strict" in strict.stderr.splitlines()[-1]


def test_strict_passes_a_manifest_that_converts_as_it_is(tmp_path: Path) -> None:
    clean = tmp_path / "clean.yaml"
    clean.write_text(
        "apiVersion: sagemaker.amazonaws.com/v1\n"
        "kind: HyperPodPyTorchJob\n"
        "metadata: {name: clean}\n"
        "spec:\n"
        "  nprocPerNode: '2'\n"
        "  replicaSpecs:\n"
        "    - replicas: 2\n"
        "      template:\n"
        "        spec:\n"
        "          containers:\n"
        "            - {name: c, image: img, command: [python, train.py],\n"
        "               env: [{name: NNODES, value: '2'}]}\n"
    )
    result = resurge("convert", "--strict", str(clean))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert load_job_text(result.stdout, tmp_path).name == "clean"


def test_a_shell_script_whose_launcher_cannot_be_taken_off_fails(tmp_path: Path) -> None:
    manifest = tmp_path / "shell.yaml"
    manifest.write_text(
        "apiVersion: sagemaker.amazonaws.com/v1\n"
        "kind: HyperPodPyTorchJob\n"
        "metadata: {name: shell}\n"
        "spec:\n"
        "  replicaSpecs:\n"
        "    - replicas: 2\n"
        "      template:\n"
        "        spec:\n"
        "          containers:\n"
        "            - name: c\n"
        "              command: [bash, -c, 'RUN=hyperpodrun; $RUN --nproc-per-node=8 t.py']\n"
    )
    result = resurge("convert", str(manifest))
    assert result.returncode == 2 and result.stdout == ""
    assert f"{CONTAINER}.command: this shell script starts hyperpodrun" in result.stderr


def load_job_text(text: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "out.yaml"
    path.write_text(text)
    return load_job(path)
