"""A real launch agent process for one worker group, as a node's monitor starts it.

``launch_agent`` runs ``python -m resurge_node_agent launch`` with the worker group in
its environment (``spec_environment``), connected to the test's NATS server, its output
appended to ``log``; ``free_port`` is a TCP port nothing listens on now.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from resurge.cluster.protocol import WorkerGroupSpec
from resurge.runtime.settings import Settings
from resurge_node_agent.launch.group_spec import spec_environment

__all__ = ["free_port", "launch_agent"]


def launch_agent(
    settings: Settings, spec: WorkerGroupSpec, log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start the agent of ``spec``; ``env`` adds to the test's own environment."""
    environment = {
        **os.environ,
        **(env or {}),
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_LOG_FORMAT": "text",
        **spec_environment(spec),
    }
    with log.open("ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "resurge_node_agent", "launch"],
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
