"""Cluster backends: the one protocol restarter and scaler use to act on a cluster."""

from resurge.cluster.protocol import ClusterBackend, NodeInfo, WorkerGroupSpec

__all__ = ["ClusterBackend", "NodeInfo", "WorkerGroupSpec"]
