"""What the ``resurge`` command says before it needs a cluster: every subcommand's
``--help`` describes it, ``schema`` prints to stdout unless told a folder, ``inject log``
needs its line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from resurge.cli.main import _parser, main


def _subcommands() -> list[str]:
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    raise AssertionError("resurge has no subcommands")


@pytest.mark.parametrize("command", _subcommands())
def test_every_subcommand_help_says_what_it_does(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    usage, _, rest = capsys.readouterr().out.partition("\n\n")
    description = rest.split("\n\n")[0]
    assert usage.startswith(f"usage: resurge {command}")
    assert not description.lstrip().startswith(("positional", "options")), description
    assert len(description.split()) >= 3, description


def test_schema_without_out_prints_every_schema_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["schema"]) == 0
    schemas = json.loads(capsys.readouterr().out)
    assert schemas["assign"]["title"] == "Assign" and "TrainingJob" in schemas
    assert list(tmp_path.iterdir()) == []


def test_schema_crd_dash_prints_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--crd", "-"]) == 0
    assert "name: trainingjobs.resurge.dev" in capsys.readouterr().out


def test_inject_log_needs_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["inject", "log", "--job", "j", "--rank", "0"])
    assert exit_.value.code == 2
    assert "missing --line" in capsys.readouterr().err
