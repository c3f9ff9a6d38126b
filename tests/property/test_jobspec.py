"""Job specs: any document, and any file, is a TrainingJob or a JobSpecError naming why.

A job spec comes from a user's YAML or a TrainingJob object someone applied; whatever it
holds, the caller (the CLI, the scaler, the Kubernetes controller) gets a JobSpecError
it reports, never another exception.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resurge.jobspec import JobSpecError, TrainingJob, load_job, parse_job
from tests.property.strategies import VALID_JOB_DOCUMENT, json_values

VALID = VALID_JOB_DOCUMENT


def parse_or_error(document: Any) -> TrainingJob | JobSpecError:
    try:
        return parse_job(document)
    except JobSpecError as error:
        assert str(error)
        return error


def paths(document: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every path to a value in ``document``."""
    found: list[tuple[str | int, ...]] = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += paths(value, (*prefix, index))
    return found


def replaced(document: Any, path: tuple[str | int, ...], value: Any) -> Any:
    changed = copy.deepcopy(document)
    parent = changed
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return changed


def test_the_example_is_valid() -> None:
    assert isinstance(parse_or_error(VALID), TrainingJob)


@given(json_values)
def test_any_json_value_is_a_job_or_a_job_spec_error(document: Any) -> None:
    parse_or_error(document)


@given(st.sampled_from(paths(VALID)), json_values)
def test_a_bad_value_anywhere_names_its_field(path: tuple[str | int, ...], value: Any) -> None:
    result = parse_or_error(replaced(VALID, path, value))
    if isinstance(result, JobSpecError):  # else the value happened to fit
        named = [str(part) for part in path if isinstance(part, str)]
        assert any(name in str(result) for name in named), (path, str(result))


@given(st.sampled_from([p for p in paths(VALID) if isinstance(p[-1], str)]), st.text(max_size=12))
def test_an_unknown_field_is_named(path: tuple[str | int, ...], name: str) -> None:
    parent: Any = VALID
    for part in path[:-1]:
        parent = parent[part]
    if not isinstance(parent, dict) or name in parent:
        return
    changed = replaced(VALID, (*path[:-1], name), 1)
    result = parse_or_error(changed)
    assert isinstance(result, JobSpecError)
    assert repr(name)[1:-1] in str(result) or name in str(result)


LOG_RULE_PATTERNS = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "(a+)+$",
            "(a|aa)*b",
            "a{4294967296}",
            "a{99999999999999999999}",
            "(" * 2000 + ")" * 2000,
            "[",
            "(?P<x>a)(?P<x>b)",
            "\\",
        ]
    ),
)


@given(LOG_RULE_PATTERNS)
def test_any_log_rule_pattern_is_accepted_or_named(pattern: str) -> None:
    spec = copy.deepcopy(VALID)
    spec["spec"]["monitoring"] = {
        "logRules": [{"name": "r", "logPattern": pattern, "faultOnMatch": True}]
    }
    result = parse_or_error(spec)
    if isinstance(result, JobSpecError):
        assert "logPattern" in str(result)


def load_or_error(path: Path) -> TrainingJob | JobSpecError:
    try:
        return load_job(path)
    except JobSpecError as error:
        assert str(error)
        return error


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(st.binary(max_size=300), st.builds(lambda v: yaml.safe_dump(v).encode(), json_values))
)
def test_any_file_loads_as_a_job_or_a_job_spec_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "job.yaml"  # the same file for every example: rewritten each time
    path.write_bytes(data)
    load_or_error(path)


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 1200,
        b"{" * 1200,
        b"a: &a [*a]",
        b"\xff\xfe\x00\x00",
        b"!!python/object/apply:os.system ['true']",
        b"- " * 1500 + b"x",
    ],
    ids=[
        "deep-flow-list",
        "deep-flow-map",
        "self-reference",
        "not-utf8",
        "python-tag",
        "deep-block",
    ],
)
def test_hostile_files_are_job_spec_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    assert isinstance(load_or_error(path), JobSpecError)
