"""The envelope every message shares (DESIGN section 2).

Each event kind is a subclass that fixes ``kind`` to a literal; the union of all of
them (see :mod:`resurge.events`) decodes any message. ``id`` is unique per event and is
sent as JetStream's ``Nats-Msg-Id`` so a re-published event is stored once.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SCHEMA_VERSION", "Envelope", "Source"]

SCHEMA_VERSION = 1


class Source(BaseModel):
    """The service instance that published an event."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str = Field(description="Service that published the event.", examples=["detector"])
    instance: str = Field(
        description="Instance of that service (host and process id by default).",
        examples=["node-1:4242"],
    )

    @classmethod
    def here(cls, service: str) -> Source:
        """This process as an instance of ``service``: host name and process id."""
        return cls(service=service, instance=f"{socket.gethostname()}:{os.getpid()}")


def _new_id() -> str:
    return uuid.uuid4().hex


def _now() -> datetime:
    return datetime.now(UTC)


class Envelope(BaseModel):
    """Fields common to every event; ``kind`` is fixed by each subclass."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(
        default_factory=_new_id,
        min_length=1,
        max_length=128,
        description="Unique event id, used as the JetStream Nats-Msg-Id for de-duplication "
        "(telemetry, published once, is sent without it).",
    )
    kind: str = Field(description="Event kind; selects the model.")
    schema_version: int = Field(
        default=SCHEMA_VERSION, ge=1, description="Version of this kind's schema."
    )
    time: datetime = Field(default_factory=_now, description="When it happened (UTC).")
    source: Source = Field(description="Who published it.")
    job: str | None = Field(default=None, description="Training job name, where it applies.")
    replica: int | None = Field(
        default=None, ge=0, description="Replica (worker group) index, where it applies."
    )
    node: str | None = Field(default=None, description="Node name, where it applies.")
    rank: int | None = Field(default=None, ge=0, description="Global rank, where it applies.")
    generation: int | None = Field(
        default=None, ge=0, description="Job generation the event belongs to, where it applies."
    )
