"""Job lifecycle events on ``job.<job>``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from resurge.events.envelope import Envelope
from resurge.jobspec import TrainingJob

__all__ = ["JobDeleted", "JobSubmitted", "ReplicaFinished"]


class JobSubmitted(Envelope):
    """A TrainingJob was submitted (``resurge submit``, or on Kubernetes the controller
    for each new ``metadata.generation`` of a TrainingJob)."""

    kind: Literal["job_submitted"] = "job_submitted"
    spec: TrainingJob = Field(description="The validated TrainingJob.")
    update: bool = Field(
        default=False,
        description="An edit of a job submitted before (a new metadata.generation of its "
        "TrainingJob): applied to the job while it runs; a finished job, or one with no "
        "record, is not started again.",
    )


class JobDeleted(Envelope):
    """A job was deleted: its workers stop and it is forgotten."""

    kind: Literal["job_deleted"] = "job_deleted"


class ReplicaFinished(Envelope):
    """Every worker of the replica exited 0 in ``generation`` (published by the detector)."""

    kind: Literal["replica_finished"] = "replica_finished"
