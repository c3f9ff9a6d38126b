"""Dead letters on ``dlq.<service>``: messages a service could not decode."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from resurge.events.envelope import Envelope

__all__ = ["DeadLetter", "DeadLetterReason"]


class DeadLetterReason(StrEnum):
    """A bounded set, so it can be a metric label."""

    NOT_JSON = "not_json"
    UNKNOWN_KIND = "unknown_kind"
    INVALID = "invalid"
    UNEXPECTED_KIND = "unexpected_kind"
    # A raw event whose body names another job or node than its subject (a forgery).
    SUBJECT_MISMATCH = "subject_mismatch"


class DeadLetter(Envelope):
    """A message a service could not use, kept with why, for people to look at."""

    kind: Literal["dead_letter"] = "dead_letter"
    subject: str = Field(description="Subject the message arrived on.")
    reason: DeadLetterReason = Field(description="Why it could not be used.")
    detail: str = Field(description="The decoder's words, cut to a few hundred characters.")
    payload: str = Field(
        description="The message body, decoded as UTF-8 with replacement characters, cut."
    )
    payload_bytes: int = Field(ge=0, description="Length of the original body in bytes.")
