"""JSON Schemas of every event kind and of the TrainingJob, for the docs and for users;
and the TrainingJob CustomResourceDefinition as YAML, for deploy/crds/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from resurge.events import EVENT_ADAPTER, EVENT_KINDS
from resurge.jobspec import TrainingJob
from resurge.jobspec.crd import training_job_crd

__all__ = [
    "CRD_HEADER",
    "all_schemas",
    "crd_yaml",
    "run_schema",
    "write_crd",
    "write_schemas",
]

CRD_HEADER = (
    "# Generated from the TrainingJob models (shared/resurge/jobspec/) by\n"
    "# `resurge schema --crd deploy/crds/trainingjobs.yaml` (make schemas): do not edit.\n"
)


def all_schemas() -> dict[str, dict[str, object]]:
    """``{name: schema}``: one per event kind, ``event`` (the union) and ``TrainingJob``."""
    schemas: dict[str, dict[str, object]] = {
        kind: model.model_json_schema(by_alias=True) for kind, model in sorted(EVENT_KINDS.items())
    }
    schemas["event"] = EVENT_ADAPTER.json_schema(by_alias=True)
    schemas["TrainingJob"] = TrainingJob.model_json_schema(by_alias=True)
    return schemas


def write_schemas(folder: Path) -> list[Path]:
    """Write each schema to ``folder/NAME.schema.json``; returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in all_schemas().items():
        path = folder / f"{name}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def crd_yaml() -> str:
    """The TrainingJob CustomResourceDefinition as a YAML document, keys sorted."""
    return CRD_HEADER + yaml.safe_dump(training_job_crd(), sort_keys=True, width=100)


def write_crd(path: Path) -> Path:
    """Write :func:`crd_yaml` to ``path``, creating its folder; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(crd_yaml())
    return path


def run_schema(out: Path | None, crd: Path | None) -> int:
    """``resurge schema``: every schema as one JSON document on stdout, or (``out``) one
    file each in that folder; ``crd``: the CRD to that file, or to stdout for ``-``."""
    if crd is not None:
        if str(crd) == "-":
            sys.stdout.write(crd_yaml())
        else:
            print(write_crd(crd))
    if out is not None:
        for path in write_schemas(out):
            print(path)
    elif crd is None:
        print(json.dumps(all_schemas(), indent=2, sort_keys=True))
    return 0
