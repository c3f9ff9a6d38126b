"""Bucket names and keys of the local backend's JetStream KV records.

A node's record and its cordon are keyed by the escaped node name; a worker group by
``<node>.<job>.<replica>`` (escaped tokens), so one node's groups are the keys under
``<node>.>``; a job's status by the escaped job name. :func:`parse_worker_group_key`
inverts :func:`worker_group_key` (a deleted group's watch entry carries only its key).
"""

from __future__ import annotations

from resurge.contract.subjects import escape_token, unescape_token

__all__ = [
    "CORDONS_BUCKET",
    "JOB_STATUS_BUCKET",
    "NODES_BUCKET",
    "WORKER_GROUPS_BUCKET",
    "node_key",
    "parse_worker_group_key",
    "worker_group_key",
]

NODES_BUCKET = "nodes"
CORDONS_BUCKET = "cordons"
WORKER_GROUPS_BUCKET = "workergroups"
JOB_STATUS_BUCKET = "jobstatus"


def node_key(node: str) -> str:
    """The key of ``node``'s record and of its cordon."""
    return escape_token(node)


def worker_group_key(node: str, job: str, replica: int) -> str:
    """The key of the worker group of (``job``, ``replica``) on ``node``."""
    return f"{escape_token(node)}.{escape_token(job)}.{replica}"


def parse_worker_group_key(key: str) -> tuple[str, str, int]:
    """(node, job, replica) of a :func:`worker_group_key`; ValueError if it is none."""
    parts = key.split(".")
    if len(parts) != 3 or not parts[2].isdigit():
        raise ValueError(f"not a worker-group key: {key!r}")
    return unescape_token(parts[0]), unescape_token(parts[1]), int(parts[2])
