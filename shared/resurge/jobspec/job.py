"""The TrainingJob document: metadata, spec, status, and reading it from YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, model_validator

from resurge.jobspec._base import SpecModel
from resurge.jobspec.accelerator import ACCELERATOR_PATTERN, accelerator_problem
from resurge.jobspec.elastic import ElasticSpec, fold_elastic_policy
from resurge.jobspec.errors import describe
from resurge.jobspec.monitoring import MonitoringSpec
from resurge.jobspec.mutability import immutable_fields
from resurge.jobspec.quantity import MemorySize
from resurge.jobspec.recovery import RecoverySpec
from resurge.jobspec.replicas import ReplicaSpec
from resurge.jobspec.status import TrainingJobStatus

__all__ = [
    "API_VERSION",
    "CheckpointSpec",
    "EnvVar",
    "JobSpecError",
    "Metadata",
    "TrainingJob",
    "TrainingJobSpec",
    "load_job",
    "parse_job",
]

API_VERSION = "resurge.dev/v1alpha1"
_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$"


class EnvVar(SpecModel):
    """One extra environment variable of the workers, as in a Kubernetes container."""

    name: str = Field(description="Environment variable name.", min_length=1)
    value: str = Field(default="", description="Its value.")


class CheckpointSpec(SpecModel):
    """Where workers write checkpoints and how often, and how often the state they
    protect is snapshotted to memory and the most memory those snapshots may take;
    handed to them through the agent."""

    dir: str | None = Field(
        default=None, description="Folder the workers checkpoint into.", examples=["/ckpt/j"]
    )
    interval_steps: int | None = Field(
        default=None, ge=1, description="Checkpoint every this many steps."
    )
    interval_seconds: float | None = Field(
        default=None, gt=0, description="Checkpoint at least this often, in seconds."
    )
    memory_interval_steps: int | None = Field(
        default=None,
        ge=1,
        description="Snapshot the state a script protects (resurge.worker's protect) to "
        "the node's memory every this many steps; none: every step. A restart resumes "
        "from the newest live snapshot, a disk checkpoint only when none is complete.",
    )
    memory_budget: MemorySize | None = Field(
        default=None,
        description="The most memory one worker group's snapshots may take in its node's "
        "memory (its own and the buddy copies it holds for a peer): a Kubernetes quantity "
        "(8Gi, 512Mi, 1G) or a whole number of bytes; held in bytes. Unset: no budget of "
        "resurge's own (the node's /dev/shm limits it).",
        examples=["8Gi"],
    )


# What the fork server imports by default: torch, plus what DDP and DCP import lazily.
DEFAULT_PRELOAD = ("torch", "torch._dynamo", "torch.distributed.checkpoint")


class TrainingJobSpec(SpecModel):
    """What to run, on how many replicas, and how to detect and recover from faults.

    HyperPod's ``elasticPolicy`` block is accepted on input as it is and folded into
    ``replicas``, ``elastic`` and ``recovery``; it is never written back. Only the
    fields :data:`~resurge.jobspec.mutability.MUTABLE` names can change once the job
    exists (CEL rules in the CRD).
    """

    model_config = ConfigDict(json_schema_extra=immutable_fields("spec"))

    command: list[str] = Field(
        min_length=1,
        description="Argv of the training script, run by the agent as torchrun would.",
        examples=[["python", "train.py"]],
    )
    image: str | None = Field(
        default=None, description="Container image of the workers (Kubernetes only)."
    )
    template: dict[str, Any] | None = Field(
        default=None,
        description="Pod template the workers' pods start from (Kubernetes only); free-form.",
    )
    accelerator: str | None = Field(
        default=None,
        pattern=ACCELERATOR_PATTERN,
        description="Kubernetes only: the extended resource each worker process takes one "
        "device of; each pod requests nprocPerNode of it. Unset: the accelerator the "
        "template's first container names in its resources (nvidia.com/gpu, a MIG "
        "profile, amd.com/gpu, aws.amazon.com/neuron or neuroncore, ...), else none: a "
        "CPU-only job, whose pods request no accelerator.",
        examples=["nvidia.com/gpu", "aws.amazon.com/neuroncore", "nvidia.com/mig-1g.10gb"],
    )
    nproc_per_node: int = Field(
        default=1, ge=1, alias="nprocPerNode", description="Worker processes per replica."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra worker environment.")
    working_dir: str | None = Field(
        default=None, alias="workingDir", description="Folder the workers start in."
    )
    fork_server: bool = Field(
        default=True,
        alias="forkServer",
        description="Start workers from a fork server that has already imported "
        "preloadModules, so a process-level restart skips interpreter start-up and imports.",
    )
    preload_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PRELOAD),
        alias="preloadModules",
        description="Modules the fork server imports once (a missing one is skipped). The "
        "default includes torch._dynamo, which DistributedDataParallel otherwise imports "
        "in every worker on first use (seconds per restart).",
    )
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec, description="Replica counts.")
    elastic: ElasticSpec = Field(
        default_factory=ElasticSpec,
        description="How resizes of an elastic job are paced and bounded in time.",
    )
    priority: int = Field(
        default=0, description="Higher runs first and is shrunk last when capacity is short."
    )
    priority_class_name: str | None = Field(
        default=None, description="Kubernetes PriorityClass of the pods (Kubernetes only)."
    )
    queue: str | None = Field(
        default=None,
        description="Kueue LocalQueue to submit to, where Kueue is installed (Kubernetes only).",
    )
    suspend: bool = Field(
        default=False,
        description="Hold the job: no replica runs. Set on a running job, it checkpoints and "
        "is suspended (back to Pending with its checkpoint); cleared, it resumes from it. A "
        "job with a Kueue queue is also held while Kueue has not admitted it (Kubernetes).",
    )
    recovery: RecoverySpec = Field(
        default_factory=RecoverySpec, description="Recovery ladder and limits."
    )
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec, description="How faults and hangs are detected."
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec, description="Checkpoint folder and interval."
    )

    @model_validator(mode="before")
    @classmethod
    def _hyperpod_elastic_policy(cls, data: Any) -> Any:
        return fold_elastic_policy(data)

    @model_validator(mode="after")
    def _one_accelerator(self) -> TrainingJobSpec:
        problem = accelerator_problem(self.accelerator, self.template, self.nproc_per_node)
        if problem is not None:
            raise ValueError(problem)
        return self


class Metadata(SpecModel):
    """The job's name and labels, as a Kubernetes object's metadata."""

    name: str = Field(pattern=_NAME_PATTERN, description="Job name (a Kubernetes object name).")
    namespace: str = Field(default="default", description="Kubernetes namespace.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")


class TrainingJob(SpecModel):
    """A training job, the document ``resurge submit`` takes (docs/jobspec.md)."""

    api_version: Literal["resurge.dev/v1alpha1"] = Field(
        default="resurge.dev/v1alpha1",
        alias="apiVersion",
        description="Always resurge.dev/v1alpha1.",
    )
    kind: Literal["TrainingJob"] = Field(default="TrainingJob", description="Always TrainingJob.")
    metadata: Metadata = Field(description="Name and labels.")
    spec: TrainingJobSpec = Field(description="What to run and how to keep it running.")
    status: TrainingJobStatus | None = Field(
        default=None, description="Written by resurge; ignored on submission."
    )

    @property
    def name(self) -> str:
        """The job's name (``metadata.name``)."""
        return self.metadata.name


class JobSpecError(ValueError):
    """A job spec that does not validate; the message names every bad field."""


def parse_job(document: Any) -> TrainingJob:
    """Validate a decoded YAML/JSON document as a TrainingJob."""
    if not isinstance(document, dict):
        raise JobSpecError("a job spec must be a mapping with apiVersion, kind, metadata, spec")
    try:
        return TrainingJob.model_validate(document)
    except ValidationError as error:
        raise JobSpecError(f"invalid TrainingJob: {describe(error, TrainingJob)}") from None


def load_job(path: Path) -> TrainingJob:
    """Read and validate a TrainingJob YAML file."""
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise JobSpecError(f"{path}: not valid YAML: {error}") from None
    except UnicodeDecodeError as error:
        raise JobSpecError(f"{path}: not UTF-8 text: {error}") from None
    except RecursionError:
        raise JobSpecError(f"{path}: not valid YAML: nested too deeply") from None
    try:
        return parse_job(document)
    except JobSpecError as error:
        raise JobSpecError(f"{path}: {error}") from None
