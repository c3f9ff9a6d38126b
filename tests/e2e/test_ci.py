"""`.ci/run` runs `make test`, and a failing or empty test run fails the build."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ci_script_calls_make_test_and_stops_on_errors() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert "set -euo pipefail" in script
    assert [line for line in script.splitlines() if line.startswith("make")] == ["make test"]


@pytest.mark.parametrize(
    ("test_source", "expected_code"),
    [("def test_fails():\n    assert 1 == 2\n", 1), ("", 5)],
    ids=["failing-test", "no-tests"],
)
def test_make_pytest_fails_when_a_test_fails_or_none_runs(
    tmp_path: Path, test_source: str, expected_code: int
) -> None:
    (tmp_path / "test_sample.py").write_text(test_source)
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "pytest",
            "PYTEST_WORKERS=0",
            f"PYTEST_ARGS=-p no:cacheprovider {tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert f"Error {expected_code}" in result.stderr
