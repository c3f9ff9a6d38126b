"""The bus's permission model: each role's NATS user and what it may publish and
subscribe to (:mod:`.permissions`), and the nats-server configs built from them
(:mod:`.server_config`). A local cluster writes its users with
:class:`resurge.local.access.LocalAccess`; the Kubernetes dev overlay's server config is
generated from the same model."""
