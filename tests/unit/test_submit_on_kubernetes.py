"""``resurge submit`` against a Kubernetes cluster is refused, saying what to do: there a
job is a TrainingJob (its pods are owned by it and take its image and template), so a
job submitted on the bus would never get a pod, and the controller would delete it."""

from __future__ import annotations

from pathlib import Path

import pytest

from resurge.cli.main import main

JOB = """\
apiVersion: resurge.dev/v1alpha1
kind: TrainingJob
metadata: {name: llama}
spec: {command: [python, train.py], nprocPerNode: 1}
"""


def test_submit_on_kubernetes_says_to_apply_the_training_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "job.yaml"
    file.write_text(JOB)
    monkeypatch.setenv("RESURGE_NATS_URL", "nats://127.0.0.1:1")  # never reached
    monkeypatch.setenv("RESURGE_CLUSTER", "kubernetes")
    assert main(["submit", str(file)]) == 2
    err = capsys.readouterr().err
    assert "kubectl apply -f" in err and str(file) in err, err
