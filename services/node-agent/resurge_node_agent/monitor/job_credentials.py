"""The NATS user a node monitor starts a job's launch agent with.

On a local cluster with users, each job on a node has a user of its own for its launch
agents (:func:`resurge.access.permissions.job_agent_user`: its job's raw events on this
node, its commands): the monitor's environment names the folder where the supervisor
puts its credentials file once the server accepts the user
(:data:`~resurge.runtime.nats_auth.JOB_CREDENTIALS_DIR`), and :func:`launch_credentials`
waits for it there. Elsewhere (no such folder: a server without users, or Kubernetes,
where the agent is a pod's own process) the launch agent keeps the monitor's
environment's connection variables.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from resurge.access.permissions import job_agent_user
from resurge.runtime.nats_auth import JOB_CREDENTIALS_DIR

__all__ = ["launch_credentials"]

log = logging.getLogger(__name__)

# The supervisor makes the user within a loop turn and a config reload.
WAIT_SECONDS = 30.0
_POLL_SECONDS = 0.05


async def launch_credentials(
    environ: Mapping[str, str], node: str, job: str, wait_seconds: float = WAIT_SECONDS
) -> dict[str, str]:
    """The variables that connect ``job``'s launch agent on ``node`` as its own user
    (none to change where ``environ`` names no folder of such users). A file that is not
    there after ``wait_seconds`` is named all the same: the agent fails to connect and
    is started again, as any agent whose start failed."""
    folder = environ.get(JOB_CREDENTIALS_DIR)
    if not folder:
        return {}
    path = Path(folder) / f"{job_agent_user(node, job)}.json"
    deadline = time.monotonic() + wait_seconds
    while not path.exists():
        if time.monotonic() >= deadline:
            log.warning("no NATS user for job %s on %s after %g s", job, node, wait_seconds)
            break
        await asyncio.sleep(_POLL_SECONDS)  # another process's progress: polled, bounded
    return {"RESURGE_NATS_CREDENTIALS": str(path), JOB_CREDENTIALS_DIR: ""}
