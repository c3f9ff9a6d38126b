"""Logging: one JSON object per line (for log shippers), or one readable text line,
each with fixed context keys.

Pass context through ``extra`` (``log.info("...", extra={"job": name})``); the keys in
:data:`CONTEXT_KEYS` appear when set. :class:`RateLimitedLog` logs a recurring
condition once per key and interval.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

__all__ = ["CONTEXT_KEYS", "RateLimitedLog", "configure_logging"]

CONTEXT_KEYS = (
    "service",
    "event_id",
    "kind",
    "job",
    "replica",
    "node",
    "rank",
    "generation",
    "subject",
    "reason",
)


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "service": self.service,
            "message": record.getMessage(),
        }
        for key in CONTEXT_KEYS:
            value = record.__dict__.get(key)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``time service LEVEL message key=value ...``: the context keys that are set."""

    def __init__(self, service: str) -> None:
        super().__init__(f"%(asctime)s {service} %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{key}={record.__dict__[key]}"
            for key in CONTEXT_KEYS[1:]
            if record.__dict__.get(key) is not None
        )
        if not context:
            return line
        head, newline, rest = line.partition("\n")  # after the message, before a traceback
        return f"{head} [{context}]{newline}{rest}"


def configure_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    """Send every log record to stderr, as JSON (default) or plain text."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(TextFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # nats.py logs every reconnect attempt at ERROR through its own callbacks; we log ours.
    logging.getLogger("nats").setLevel(logging.CRITICAL)


class RateLimitedLog:
    """Logs a message for a key at most once per ``interval`` seconds."""

    def __init__(self, logger: logging.Logger, interval: float = 60.0) -> None:
        self.logger = logger
        self.interval = interval
        self._last: dict[str, float] = {}

    def warning(self, key: str, message: str, **extra: Any) -> bool:
        """Log ``message`` unless ``key`` was logged within the interval; True if logged."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            return False
        self._last[key] = now
        self.logger.warning(message, extra=extra)
        return True
