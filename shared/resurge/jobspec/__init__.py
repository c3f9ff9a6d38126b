"""The TrainingJob spec (DESIGN section 3): one schema for local YAML and the CRD.

Pydantic models, frozen, camelCase on the wire and snake_case in Python. Unknown
fields are rejected with their dotted path named (``extra="forbid"``); HyperPod's names
are accepted where they mean the same thing. docs/jobspec.md describes every field.

The enums it shares with the events (recovery levels, phases, fault scopes) come from
:mod:`resurge.contract.vocabulary`, so the spec never imports :mod:`resurge.events`,
which embeds it.
"""

from __future__ import annotations

from resurge.jobspec.elastic import ElasticSpec
from resurge.jobspec.job import (
    API_VERSION,
    CheckpointSpec,
    EnvVar,
    JobSpecError,
    Metadata,
    TrainingJob,
    TrainingJobSpec,
    load_job,
    parse_job,
)
from resurge.jobspec.monitoring import GpuPolicy, LogRule, MonitoringSpec, StragglerSpec
from resurge.jobspec.recovery import BackoffSpec, RecoverySpec
from resurge.jobspec.replicas import ReplicaSpec
from resurge.jobspec.status import (
    CheckpointRef,
    FaultSummary,
    ReplicaCounts,
    ResizeSummary,
    TrainingJobStatus,
)

__all__ = [
    "API_VERSION",
    "BackoffSpec",
    "CheckpointRef",
    "CheckpointSpec",
    "ElasticSpec",
    "EnvVar",
    "FaultSummary",
    "GpuPolicy",
    "JobSpecError",
    "LogRule",
    "Metadata",
    "MonitoringSpec",
    "RecoverySpec",
    "ReplicaCounts",
    "ReplicaSpec",
    "ResizeSummary",
    "StragglerSpec",
    "TrainingJob",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "load_job",
    "parse_job",
]
