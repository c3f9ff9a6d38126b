"""resurge detector: turns raw node-agent events into fault and lifecycle events."""
