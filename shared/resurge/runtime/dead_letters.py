"""Counting and dead-lettering messages a service cannot use.

Every subscriber hands undecodable or unexpected messages here: the message is counted
by reason (``resurge_dead_letters_total{reason}``), logged once per reason and minute,
and re-published as a :class:`~resurge.events.DeadLetter` on ``dlq.<service>``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter

from resurge.contract.subjects import Subjects
from resurge.events import DeadLetter, DeadLetterReason, Envelope, Source
from resurge.runtime.logs import RateLimitedLog

__all__ = ["DeadLetterOffice"]

_MAX_PAYLOAD_CHARS = 4096
_MAX_DETAIL_CHARS = 512

log = logging.getLogger("resurge.runtime.dead_letters")


class DeadLetterOffice:
    """Counts, logs (rate-limited) and publishes a service's dead letters."""

    def __init__(
        self,
        service: str,
        subjects: Subjects,
        registry: CollectorRegistry,
        publish: Callable[[str, Envelope], Awaitable[None]],
    ) -> None:
        self.service = service
        self.subjects = subjects
        self._publish = publish
        self._source = Source.here(service)
        self._log = RateLimitedLog(log, interval=60.0)
        # ``reason`` is bounded: a DeadLetterReason, a closed enum. The service is the
        # scrape target's (each service serves its own registry; the prometheus
        # component puts it in a ``service`` label), so it needs no label here.
        self.counter = Counter(
            "resurge_dead_letters_total",
            "Messages this service could not use, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in DeadLetterReason:
            self.counter.labels(reason.value)

    def count(self, reason: DeadLetterReason) -> int:
        """Messages dead-lettered so far for ``reason``."""
        return int(self.counter.labels(reason.value)._value.get())

    async def send(self, subject: str, data: bytes, reason: DeadLetterReason, detail: str) -> None:
        """Dead-letter a message that arrived on ``subject``, on ``dlq.<service>``."""
        self.counter.labels(reason.value).inc()
        self._log.warning(
            reason.value,
            f"dead-lettered a message on {subject}: {reason.value}: {detail[:200]}",
            subject=subject,
            reason=reason.value,
        )
        letter = DeadLetter(
            source=self._source,
            subject=subject,
            reason=reason,
            detail=detail[:_MAX_DETAIL_CHARS],
            payload=data[:_MAX_PAYLOAD_CHARS].decode("utf-8", errors="replace"),
            payload_bytes=len(data),
        )
        await self._publish(self.subjects.dlq(self.service), letter)
