"""A job record read from a watch of the jobs bucket, whatever version wrote it.

Every service watches the jobs bucket, and any version of resurge may write to it: a
newer one may add a field or a phase this one does not know, and a record that does not
validate here must not end the watch (the detector then stopped following every job:
no new spec, no new generation). :meth:`RecordReader.read` turns such an entry into
None, logged once per job and minute and counted (:attr:`RecordReader.skipped`, and
:attr:`RecordReader.on_skip` for a metric); the reader keeps the last record it could
read, and the watch goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pydantic import ValidationError

from resurge.control.state.records import JobRecord
from resurge.runtime.logs import RateLimitedLog

__all__ = ["RecordReader"]


class RecordReader:
    """Reads records from jobs-bucket entries, skipping those it cannot read."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = RateLimitedLog(logger, interval=60.0)
        self.skipped = 0  # entries that did not validate
        self.on_skip: Callable[[], object] | None = None  # told of each (a metric)

    def read(self, job: str, value: bytes) -> JobRecord | None:
        """The record in ``value``, or None (logged, counted) when it does not validate."""
        try:
            return JobRecord.from_entry(value)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            problem = f"does not validate here (a newer schema?): {where}: {first['msg']}"
        except ValueError as error:  # neither JSON nor a compressed record
            problem = f"cannot be read: {error}"
        self.skipped += 1
        if self.on_skip is not None:
            self.on_skip()
        self._log.warning(
            job,
            f"job {job}: its record {problem}; kept the last one read",
            job=job,
            reason="record_unreadable",
        )
        return None
