"""The local cluster's state folder: where it is, what is running there, how to reach it.

The folder (``--state-dir``, else ``RESURGE_STATE_DIR``, else ``.resurge`` in the
current folder) holds ``cluster.json`` (NATS URL, namespace, supervisor pid, nodes),
the NATS users' credentials (``credentials/``, :mod:`resurge.local.access`),
the lock the running supervisor holds, the wanted nodes (``nodes.json`` and its lock,
:mod:`resurge.local.node_set`), the NATS server's data and every log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

__all__ = ["ClusterState", "StateLock", "credentials_path", "resolve_state_dir"]

# Where the local cluster keeps its files when no --state-dir is given.
STATE_DIR = "RESURGE_STATE_DIR"


def credentials_path(state_dir: Path, user: str) -> Path:
    """Where the NATS credentials of ``user`` live in ``state_dir`` (resurge.local.access)."""
    return state_dir / "credentials" / f"{user}.json"


def resolve_state_dir(given: Path | None) -> Path:
    """The absolute state folder: ``given``, else ``RESURGE_STATE_DIR``, else ``.resurge``."""
    if given is not None:
        return given.resolve()
    return Path(os.environ.get(STATE_DIR) or ".resurge").resolve()


@dataclass
class ClusterState:
    """What ``cluster.json`` records about the running local cluster."""

    nats_url: str
    namespace: str
    pid: int
    nodes: list[str]
    gpus_per_node: int
    tls_ca: str | None = None  # the CA that verifies the server, when it speaks TLS
    down: list[str] = field(default_factory=list)  # nodes powered off: none of them runs

    @staticmethod
    def path(state_dir: Path) -> Path:
        """Where the record lives in ``state_dir``."""
        return state_dir / "cluster.json"

    def save(self, state_dir: Path) -> None:
        """Write the record to ``state_dir``, replacing the old one atomically."""
        tmp = self.path(state_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(self.path(state_dir))

    @classmethod
    def load(cls, state_dir: Path) -> ClusterState | None:
        """The record in ``state_dir``; None when it is missing or unreadable."""
        try:
            return cls(**json.loads(cls.path(state_dir).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def nats_answers(self, timeout: float = 1.0) -> bool:
        """Whether the recorded NATS server (first URL) accepts a TCP connection."""
        try:
            address = urlsplit(self.nats_url.split(",")[0].strip())
            host, port = address.hostname or "127.0.0.1", address.port or 4222
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except (OSError, ValueError):
            return False


class StateLock:
    """An exclusive lock on the state folder, held by its running supervisor."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "lock"
        self._file: IO[str] | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; False if another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._file = handle
        return True

    def held_elsewhere(self) -> bool:
        """True while another process holds the lock."""
        if not self.path.exists():
            return False
        if self.acquire():
            self.release()
            return False
        return True

    def release(self) -> None:
        """Let go of the lock if this object holds it."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
