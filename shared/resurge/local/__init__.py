"""Local mode: an embedded nats-server and resurge's services as processes on this machine."""
