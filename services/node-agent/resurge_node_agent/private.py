"""What keeps an agent's NATS credentials out of its workers' reach.

- :func:`worker_base_environment`: the environment a worker, the fork server and a
  rendezvous store start from: the agent's own, without any ``RESURGE_NATS_*`` variable
  (the agent's user, password or credentials file, its TLS client key, its server's
  address). What a worker needs is passed to it explicitly
  (:mod:`resurge_node_agent.launch.worker_env`); workers talk to their agent over its
  unix socket, never to NATS.
- :func:`make_undumpable`: the agent process itself (monitor and launch) is not
  dumpable (``prctl(PR_SET_DUMPABLE, 0)``, Linux): a process of the same user, such as a
  worker, cannot read its ``/proc/<pid>/environ`` or memory, nor ptrace it. A process
  with ``CAP_SYS_PTRACE`` still can (root outside a container; a container does not have
  that capability unless it is added). The flag is not inherited across ``exec``: the
  fork server and the workers it forks are dumpable, and hold nothing secret.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Mapping

__all__ = ["AGENT_ONLY_PREFIX", "make_undumpable", "worker_base_environment"]

log = logging.getLogger(__name__)

# Every variable of the agent's NATS connection: credentials, TLS files, the server.
AGENT_ONLY_PREFIX = "RESURGE_NATS_"
# <linux/prctl.h>
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


def worker_base_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the agent's own NATS variables (see the module docstring)."""
    return {k: v for k, v in environ.items() if not k.startswith(AGENT_ONLY_PREFIX)}


def make_undumpable() -> bool:
    """Make this process not dumpable; True when it is so now (False off Linux, or when
    the call fails, which is logged)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: errno %d", ctypes.get_errno())
        return False
    return int(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)) == 0
