"""JSON Schemas of every event kind and of the TrainingJob, for the docs and for users."""

from __future__ import annotations

import json
from pathlib import Path

from resurge.events import EVENT_ADAPTER, EVENT_KINDS
from resurge.jobspec import TrainingJob

__all__ = ["all_schemas", "write_schemas"]


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
