"""The TrainingJob spec (DESIGN section 3): one schema for local YAML and the CRD.

This is the first cut that issue 2 needs: what to run, how many replicas, the restart
limit. Unknown fields are rejected with the field named (``extra="forbid"``); HyperPod's
names are accepted as aliases where they mean the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "API_VERSION",
    "EnvVar",
    "JobSpecError",
    "Metadata",
    "RecoverySpec",
    "ReplicaSpec",
    "TrainingJob",
    "TrainingJobSpec",
    "load_job",
    "parse_job",
]

API_VERSION = "resurge.dev/v1alpha1"
_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class EnvVar(_Strict):
    name: str = Field(description="Environment variable name.", min_length=1)
    value: str = Field(default="", description="Its value.")


class ReplicaSpec(_Strict):
    min: int = Field(default=1, ge=1, description="Fewest replicas the job runs with.")
    max: int | None = Field(
        default=None, ge=1, description="Most replicas; defaults to `min` (a fixed-size job)."
    )

    @model_validator(mode="after")
    def _max_not_below_min(self) -> ReplicaSpec:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"replicas.max ({self.max}) is below replicas.min ({self.min})")
        return self


class RecoverySpec(_Strict):
    max_restarts: int = Field(
        default=3,
        ge=0,
        alias="jobMaxRetryCount",
        description="Restarts the job may take before it fails (HyperPod: jobMaxRetryCount).",
    )
    stop_grace_seconds: float = Field(
        default=10.0,
        gt=0,
        alias="stopGraceSeconds",
        description="Seconds between SIGTERM and SIGKILL when workers are stopped.",
    )


class TrainingJobSpec(_Strict):
    command: list[str] = Field(
        min_length=1, description="Argv of the training script, run by the agent as torchrun would."
    )
    nproc_per_node: int = Field(
        default=1, ge=1, alias="nprocPerNode", description="Worker processes per replica."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra worker environment.")
    working_dir: str | None = Field(
        default=None, alias="workingDir", description="Folder the workers start in."
    )
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec, description="Replica counts.")
    recovery: RecoverySpec = Field(default_factory=RecoverySpec, description="Recovery limits.")


class Metadata(_Strict):
    name: str = Field(pattern=_NAME_PATTERN, description="Job name (a Kubernetes object name).")
    namespace: str = Field(default="default", description="Kubernetes namespace.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")


class TrainingJob(_Strict):
    api_version: Literal["resurge.dev/v1alpha1"] = Field(
        default="resurge.dev/v1alpha1",
        alias="apiVersion",
        description="Always resurge.dev/v1alpha1.",
    )
    kind: Literal["TrainingJob"] = Field(default="TrainingJob", description="Always TrainingJob.")
    metadata: Metadata = Field(description="Name and labels.")
    spec: TrainingJobSpec = Field(description="What to run and how to keep it running.")

    @property
    def name(self) -> str:
        return self.metadata.name


class JobSpecError(ValueError):
    """A job spec that does not validate; the message names every bad field."""


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(document)"
        lines.append(f"{where}: {item['msg']}")
    return "; ".join(lines)


def parse_job(document: Any) -> TrainingJob:
    """Validate a decoded YAML/JSON document as a TrainingJob."""
    if not isinstance(document, dict):
        raise JobSpecError("a job spec must be a mapping with apiVersion, kind, metadata, spec")
    try:
        return TrainingJob.model_validate(document)
    except ValidationError as error:
        raise JobSpecError(f"invalid TrainingJob: {_describe(error)}") from None


def load_job(path: Path) -> TrainingJob:
    """Read and validate a TrainingJob YAML file."""
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise JobSpecError(f"{path}: not valid YAML: {error}") from None
    return parse_job(document)
