"""The launch agent's one input: its replica's :class:`WorkerGroupSpec`, as one JSON document.

The document comes from the environment variable :data:`WORKER_GROUP_ENV` (what a
node's monitor sets for each launch agent it starts, and what a Kubernetes pod spec
carries), or from a file named on the command line (a mounted ConfigMap), ``-`` for
standard input. :func:`read_spec` validates it with the model itself; a missing or bad
document raises :class:`SpecError`, whose message says where the document came from
and names each field that is wrong. Settings that belong to the agent rather than to
the worker group (NATS URL, namespace, log format) stay in ``RESURGE_*`` settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from pydantic import ValidationError

from resurge.cluster import WORKER_GROUP_ENV, WorkerGroupSpec

__all__ = ["WORKER_GROUP_ENV", "SpecError", "parse_spec", "read_spec", "spec_environment"]

# A pod gets its worker group the way a container gets its configuration: the variable
# WORKER_GROUP_ENV (or a mounted file); the agent removes it from its own environment so
# workers never see it.


class SpecError(ValueError):
    """The worker-group document is missing or invalid; the message names the fields."""


def parse_spec(text: str, origin: str) -> WorkerGroupSpec:
    """Validate ``text`` (JSON) as a :class:`WorkerGroupSpec`; ``origin`` names where it
    came from in the error. Raises :class:`SpecError`."""
    try:
        return WorkerGroupSpec.model_validate_json(text)
    except ValidationError as error:
        problems = "; ".join(_problem(detail) for detail in error.errors())
        raise SpecError(f"invalid worker group in {origin}: {problems}") from None


def read_spec(path: str | None, environ: Mapping[str, str], stdin: TextIO) -> WorkerGroupSpec:
    """The spec in file ``path`` (``-``: ``stdin``), else in ``environ[WORKER_GROUP_ENV]``.
    Raises :class:`SpecError` when there is none or it is invalid."""
    if path == "-":
        return parse_spec(stdin.read(), "standard input")
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise SpecError(f"cannot read the worker group file {path}: {error}") from None
        return parse_spec(text, path)
    document = environ.get(WORKER_GROUP_ENV)
    if not document:
        raise SpecError(f"no worker group: set {WORKER_GROUP_ENV} to its JSON or pass --spec")
    return parse_spec(document, f"${WORKER_GROUP_ENV}")


def spec_environment(spec: WorkerGroupSpec) -> dict[str, str]:
    """The variables that hand ``spec`` to a launch agent started as a child process."""
    return {WORKER_GROUP_ENV: spec.model_dump_json()}


def _problem(detail: Mapping[str, object]) -> str:
    """One validation error in words: the field it is about, and what is wrong."""
    location = detail.get("loc") or ()
    field = ".".join(str(part) for part in location) if isinstance(location, tuple) else ""
    message = str(detail.get("msg", "invalid"))
    if not field:
        return message
    if field == "command":  # the one field nothing can default
        return f"field 'command': {message} (the agent needs the worker command, its argv)"
    return f"field '{field}': {message}"
