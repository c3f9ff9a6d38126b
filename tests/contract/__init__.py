"""The backend contract suite: every ClusterBackend keeps the protocol's promises."""
