"""What a worker reads from its environment: torchrun's ranks plus resurge's variables.

Unset or empty variables take their defaults (rank 0 of generation 0, no agent, no
checkpoint), so a script also runs by hand. A variable that is set but not a
non-negative integer where one is needed raises ValueError naming it: the agent sets
these, so a bad value is a bug to surface, not to guess around.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "AGENT_SOCKET",
    "GENERATION",
    "JOB",
    "RESUME_CHECKPOINT",
    "RESUME_STEP",
    "WorkerEnvironment",
    "read_environment",
]

# Names a worker reads to find its place in the current generation; the node agent sets them.
GENERATION = "RESURGE_GENERATION"
AGENT_SOCKET = "RESURGE_AGENT_SOCKET"
RESUME_CHECKPOINT = "RESURGE_RESUME_CHECKPOINT"
RESUME_STEP = "RESURGE_RESUME_STEP"
JOB = "RESURGE_JOB"


@dataclass(frozen=True)
class WorkerEnvironment:
    """A worker's place in its job, as the agent set it (see :func:`read_environment`)."""

    socket_path: str | None
    generation: int
    rank: int
    local_rank: int
    resume_checkpoint: str | None
    resume_step: int | None


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
    )
