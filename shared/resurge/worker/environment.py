"""What a worker reads from its environment: torchrun's ranks plus resurge's variables.

Unset or empty variables take their defaults (rank 0 of generation 0, no agent, no
checkpoint), so a script also runs by hand. The job's ``spec.checkpoint`` arrives as
:data:`CHECKPOINT_DIR` (always set under an agent: the spec's ``dir``, else a folder of
the job's own, :func:`default_checkpoint_dir`), :data:`CHECKPOINT_INTERVAL_STEPS` and
:data:`CHECKPOINT_INTERVAL_SECONDS` (set where the spec sets them); where and how often
protected state is snapshotted to memory as :data:`SNAPSHOT_DIR` (the worker group's
folder in ``/dev/shm``), :data:`SNAPSHOT_INTERVAL_STEPS` and :data:`SNAPSHOT_BUDGET_BYTES`
(the most bytes the group's snapshots may take; set where the spec sets
``memoryBudget``). A variable that is set but not a non-negative integer where one is
needed raises ValueError naming it: the agent sets these, so a bad value is a bug to
surface, not to guess around.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath

__all__ = [
    "AGENT_SOCKET",
    "CHECKPOINT_DIR",
    "CHECKPOINT_INTERVAL_SECONDS",
    "CHECKPOINT_INTERVAL_STEPS",
    "GENERATION",
    "JOB",
    "RESUME_CHECKPOINT",
    "RESUME_STEP",
    "SNAPSHOT_BUDGET_BYTES",
    "SNAPSHOT_DIR",
    "SNAPSHOT_INTERVAL_STEPS",
    "WorkerEnvironment",
    "default_checkpoint_dir",
    "read_environment",
]

# Names a worker reads to find its place in the current generation; the node agent sets them.
GENERATION = "RESURGE_GENERATION"
AGENT_SOCKET = "RESURGE_AGENT_SOCKET"
RESUME_CHECKPOINT = "RESURGE_RESUME_CHECKPOINT"
RESUME_STEP = "RESURGE_RESUME_STEP"
JOB = "RESURGE_JOB"
# The job's spec.checkpoint, so every job checkpoints where and as often as its spec says
# (and two jobs run from one folder never write into the same one).
CHECKPOINT_DIR = "RESURGE_CHECKPOINT_DIR"
CHECKPOINT_INTERVAL_STEPS = "RESURGE_CHECKPOINT_INTERVAL_STEPS"
CHECKPOINT_INTERVAL_SECONDS = "RESURGE_CHECKPOINT_INTERVAL_SECONDS"
# Where the worker group keeps snapshots of protected state in the node's memory, how
# often, and the most bytes they may take there (resurge.worker.protect).
SNAPSHOT_DIR = "RESURGE_SNAPSHOT_DIR"
SNAPSHOT_INTERVAL_STEPS = "RESURGE_SNAPSHOT_INTERVAL_STEPS"
SNAPSHOT_BUDGET_BYTES = "RESURGE_SNAPSHOT_BUDGET_BYTES"


def default_checkpoint_dir(job: str, state_dir: str | os.PathLike[str] | None) -> str:
    """Where ``job`` checkpoints when its spec names no ``dir``: ``checkpoints/<job>`` in
    the local cluster's state folder (``state_dir``), else in the workers' working
    directory (Kubernetes: the pod's)."""
    folder = PurePath("checkpoints", job)
    return str(folder if state_dir is None else PurePath(state_dir) / folder)


@dataclass(frozen=True)
class WorkerEnvironment:
    """A worker's place in its job, as the agent set it (see :func:`read_environment`)."""

    socket_path: str | None
    generation: int
    rank: int
    local_rank: int
    resume_checkpoint: str | None
    resume_step: int | None
    checkpoint_dir: str | None = None
    checkpoint_interval_steps: int | None = None
    checkpoint_interval_seconds: float | None = None
    snapshot_dir: str | None = None
    snapshot_interval_steps: int | None = None
    snapshot_budget_bytes: int | None = None


def _count(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, not {text!r}")
    return value


def _seconds(environ: Mapping[str, str], name: str) -> float | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {text!r}")
    return value


def read_environment(environ: Mapping[str, str] | None = None) -> WorkerEnvironment:
    """This worker's place, from ``environ`` (default: ``os.environ``)."""
    env = os.environ if environ is None else environ
    return WorkerEnvironment(
        socket_path=env.get(AGENT_SOCKET) or None,
        generation=_count(env, GENERATION) or 0,
        rank=_count(env, "RANK") or 0,
        local_rank=_count(env, "LOCAL_RANK") or 0,
        resume_checkpoint=env.get(RESUME_CHECKPOINT) or None,
        resume_step=_count(env, RESUME_STEP),
        checkpoint_dir=env.get(CHECKPOINT_DIR) or None,
        checkpoint_interval_steps=_count(env, CHECKPOINT_INTERVAL_STEPS) or None,
        checkpoint_interval_seconds=_seconds(env, CHECKPOINT_INTERVAL_SECONDS),
        snapshot_dir=env.get(SNAPSHOT_DIR) or None,
        snapshot_interval_steps=_count(env, SNAPSHOT_INTERVAL_STEPS) or None,
        snapshot_budget_bytes=_count(env, SNAPSHOT_BUDGET_BYTES) or None,
    )
