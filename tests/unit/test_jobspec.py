from pathlib import Path

import pytest

from resurge.jobspec import JobSpecError, load_job, parse_job

REPO = Path(__file__).resolve().parents[2]


def minimal(**spec: object) -> dict[str, object]:
    return {
        "apiVersion": "resurge.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {"command": ["python", "train.py"], **spec},
    }


def test_hyperpod_names_are_accepted() -> None:
    job = parse_job(minimal(nprocPerNode=4, recovery={"jobMaxRetryCount": 7}))
    assert job.spec.nproc_per_node == 4
    assert job.spec.recovery.max_restarts == 7
    assert job.spec.replicas.min == 1 and job.spec.replicas.max is None


def test_unknown_field_is_named() -> None:
    with pytest.raises(JobSpecError, match=r"spec\.nprocPerNod: Extra inputs"):
        parse_job(minimal(nprocPerNod=2))


def test_bad_values_are_named() -> None:
    with pytest.raises(JobSpecError, match=r"spec\.replicas: .*replicas.max \(1\) is below"):
        parse_job(minimal(replicas={"min": 2, "max": 1}))
    with pytest.raises(JobSpecError, match=r"metadata\.name"):
        parse_job({**minimal(), "metadata": {"name": "Bad_Name"}})
    with pytest.raises(JobSpecError, match=r"spec\.command"):
        parse_job(minimal(command=[]))
    with pytest.raises(JobSpecError, match="kind"):
        parse_job({**minimal(), "kind": "Pod"})


def test_not_a_mapping_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="mapping"):
        parse_job(["a"])
    path = tmp_path / "bad.yaml"
    path.write_text("spec: [unclosed")
    with pytest.raises(JobSpecError, match="not valid YAML"):
        load_job(path)


def test_example_job_loads() -> None:
    job = load_job(REPO / "examples" / "crash_once" / "job.yaml")
    assert job.name == "crash-once"
    assert job.spec.replicas.min == 2
