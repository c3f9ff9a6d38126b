"""The one job factory of demos, tests and benches.

:func:`job` builds a :class:`TrainingJob` from the job spec's own (camelCase) fields
through :func:`parse_job`, so every job a test or bench runs passes the validation a
user's YAML passes. :func:`ddp_example_job` is ``examples/ddp/job.yaml`` run from the
checkout, with its checkpoints in a folder of the caller's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from resurge.jobspec import EnvVar, TrainingJob, load_job, parse_job

__all__ = ["EXAMPLE", "ddp_example_job", "job", "python_job"]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ddp" / "job.yaml"


def job(
    name: str,
    command: Sequence[str] = ("x",),
    *,
    nproc: int = 1,
    replicas: int | dict[str, Any] = 1,
    preload: Sequence[str] | None = (),
    env: dict[str, str] | None = None,
    recovery: dict[str, Any] | None = None,
    monitoring: dict[str, Any] | None = None,
    **spec: Any,
) -> TrainingJob:
    """A job named ``name`` running ``command`` as ``replicas`` x ``nproc`` workers.

    ``replicas`` is ``replicas.min``, or the whole field as written
    (``{"min": 1, "max": 2}``). ``recovery``, ``monitoring`` and ``spec`` take the spec's
    camelCase fields as they are written in YAML (``{"stopGraceSeconds": 2}``;
    ``fork_server=False`` is not a field: write ``forkServer=False``). Workers preload
    nothing unless ``preload`` says; ``preload=None`` leaves the spec's default modules,
    as a job that omits the field.
    """
    body: dict[str, Any] = {
        "command": list(command),
        "nprocPerNode": nproc,
        "replicas": replicas if isinstance(replicas, dict) else {"min": replicas},
        **spec,
    }
    if preload is not None:
        body["preloadModules"] = list(preload)
    if env:
        body["env"] = [{"name": key, "value": value} for key, value in env.items()]
    if recovery is not None:
        body["recovery"] = recovery
    if monitoring is not None:
        body["monitoring"] = monitoring
    return parse_job({"metadata": {"name": name}, "spec": body})


def python_job(name: str, script: str | Path, *args: str, **options: Any) -> TrainingJob:
    """:func:`job` running ``script`` (a path, or ``-m module``) under this Python."""
    head = ["-m", str(script)[3:]] if str(script).startswith("-m ") else [str(script)]
    return job(name, [sys.executable, *head, *args], **options)


def ddp_example_job(checkpoints: Path, **spec_updates: Any) -> TrainingJob:
    """The DDP example, run from the checkout, checkpointing into ``checkpoints``.

    ``spec_updates`` replace fields of the parsed spec (snake_case model fields, as
    ``TrainingJob.spec.model_copy(update=...)`` takes them).
    """
    example = load_job(EXAMPLE)
    env = [*example.spec.env, EnvVar(name="RESURGE_CHECKPOINT_DIR", value=str(checkpoints))]
    update = {"env": env, "working_dir": str(EXAMPLE.parents[2]), **spec_updates}
    return example.model_copy(update={"spec": example.spec.model_copy(update=update)})
