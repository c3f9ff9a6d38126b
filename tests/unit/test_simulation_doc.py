"""docs/simulation.md's sample run is what the command prints: the config it shows,
run through `resurge simulate --out DIR`, prints the same table and files (the
simulation is seeded, so its figures repeat exactly)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resurge.cli.main import main
from tests.conftest import REPO_ROOT


def sample() -> tuple[str, list[str]]:
    """The sample's sim.yaml and the lines the command printed, from the page."""
    page = (REPO_ROOT / "docs" / "simulation.md").read_text()
    block = re.search(r"```console\n(.*?)```", page, flags=re.DOTALL)
    assert block is not None
    lines = block.group(1).splitlines()
    cat = lines.index("$ cat sim.yaml")
    run = next(i for i, line in enumerate(lines) if line.startswith("$ resurge simulate"))
    assert lines[run] == "$ resurge simulate sim.yaml --out results/"
    return "\n".join(lines[cat + 1 : run]) + "\n", lines[run + 1 :]


def test_the_sample_output_is_what_the_command_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, printed = sample()
    (tmp_path / "sim.yaml").write_text(config)
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "sim.yaml", "--out", "results/"]) == 0
    assert capsys.readouterr().out.splitlines() == printed
