"""Settings every service reads once at start (pydantic-settings, prefix ``RESURGE_``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from resurge.contract.subjects import Subjects

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Common settings; a service subclasses this for its own."""

    model_config = SettingsConfigDict(env_prefix="RESURGE_", extra="ignore")

    nats_url: str = Field(
        default="nats://127.0.0.1:4222", description="NATS server URL(s), comma-separated."
    )
    namespace: str = Field(
        default="resurge", description="First subject token; separates clusters on one server."
    )
    connect_timeout_seconds: float = Field(
        default=30.0, gt=0, description="How long to retry the first connection to NATS."
    )
    metrics_host: str = Field(default="127.0.0.1", description="Address of /metrics and /healthz.")
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of /metrics and /healthz; 0 picks a free one, unset turns it off.",
    )
    cluster: Literal["local", "kubernetes"] = Field(
        default="local",
        description=(
            "Cluster backend jobs run on: 'local' (virtual nodes as JetStream KV records) "
            "or 'kubernetes' (not built yet)."
        ),
    )
    log_level: str = Field(default="INFO", description="Root log level.")
    log_format: str = Field(default="json", description="'json' or 'text'.")
    stream_max_age_seconds: float = Field(
        default=24 * 3600, gt=0, description="Retention of the durable streams."
    )
    raw_max_age_seconds: float = Field(
        default=3600, gt=0, description="Retention of the raw telemetry stream."
    )

    @property
    def subjects(self) -> Subjects:
        """The subject names of this namespace."""
        return Subjects(self.namespace)
