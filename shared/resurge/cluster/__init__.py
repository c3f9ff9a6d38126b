"""Cluster backends: the one protocol services and the CLI use to act on a cluster.

Callers get a backend from :func:`open_backend` (chosen by ``RESURGE_CLUSTER``) and
use only :class:`ClusterBackend` and the records and errors exported here.
"""

from resurge.cluster.protocol import (
    NODE_TIMEOUT_SECONDS,
    WORKER_GROUP_ENV,
    BackendError,
    ClusterBackend,
    ClusterChange,
    NodeInfo,
    Taint,
    UnknownNodeError,
    WorkerGroupSpec,
)
from resurge.cluster.select import open_backend
from resurge.cluster.watching import watching

__all__ = [
    "NODE_TIMEOUT_SECONDS",
    "WORKER_GROUP_ENV",
    "BackendError",
    "ClusterBackend",
    "ClusterChange",
    "NodeInfo",
    "Taint",
    "UnknownNodeError",
    "WorkerGroupSpec",
    "open_backend",
    "watching",
]
