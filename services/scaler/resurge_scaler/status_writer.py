"""Job status through the backend: each job record's status view, written as it changes.

:class:`StatusWriter` watches the jobs KV bucket (every record as it is, then each
change) and writes ``status_view(record)`` with ``backend.write_job_status``: the
status subresource on Kubernetes, a KV entry locally. It runs as its own task, off the
handlers' path, so a slow status write never delays an admission or a recovery.

Writes are idempotent and skipped when the view did not change (most record changes,
such as a checkpoint report, leave it as it was). A write that fails is kept and tried
again on the next change of any record; a deleted job's status is left as last written,
and so is that of a job whose record this version cannot read (a newer resurge's: it is
logged and skipped, and the watch goes on).

It must have one writer: on Kubernetes only the scaler holding the Lease runs it
(:meth:`~resurge.cluster.ClusterBackend.reconcile`). When it stops (its scaler no longer
leads, or stops), every job it told ``seen`` of is told gone (``seen(name, None)``), so a
standby's metrics show no job.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from nats.js.kv import KeyValue

from resurge.cluster import ClusterBackend
from resurge.contract.subjects import unescape_token
from resurge.control.state.record_entries import RecordReader
from resurge.control.state.records import JobRecord, status_view

__all__ = ["StatusWriter"]

log = logging.getLogger("resurge.scaler.status")


class StatusWriter:
    """Follows the job records in ``jobs`` and writes each one's status to ``backend``."""

    def __init__(
        self,
        jobs: KeyValue,
        backend: ClusterBackend,
        seen: Callable[[str, JobRecord | None], None] | None = None,
    ) -> None:
        """``seen`` (metrics) gets every record as it is read, None for a deleted one."""
        self.jobs = jobs
        self.backend = backend
        self.seen = seen
        self._written: dict[str, dict[str, object]] = {}
        self._unwritten: dict[str, dict[str, object]] = {}
        self._records = RecordReader(log)
        self._seen: set[str] = set()  # jobs told to ``seen`` and not yet told gone

    async def run(self) -> None:
        """Write statuses until cancelled: every record's now, then each change."""
        watcher = await self.jobs.watch(">")
        try:
            async for entry in watcher:
                if entry is None:  # the end of the records as they were: changes follow
                    continue
                name = unescape_token(entry.key)
                if entry.operation in ("DEL", "PURGE") or not entry.value:
                    self._written.pop(name, None)
                    self._unwritten.pop(name, None)
                    self._tell(name, None)
                    continue
                record = self._records.read(name, entry.value)
                if record is None:  # a newer resurge's: logged, the last one read stands
                    continue
                self._tell(name, record)
                self.saw(record)
                await self.flush()
        finally:
            self._forget_all()
            with contextlib.suppress(Exception):  # the connection may be closing
                await watcher.stop()  # type: ignore[no-untyped-call]  # nats.py: untyped

    def _tell(self, name: str, record: JobRecord | None) -> None:
        if self.seen is None:
            return
        self.seen(name, record)
        if record is None:
            self._seen.discard(name)
        else:
            self._seen.add(name)

    def _forget_all(self) -> None:
        for name in list(self._seen):
            self._tell(name, None)

    def saw(self, record: JobRecord) -> None:
        """Queue ``record``'s status view unless it is the one last written."""
        view = status_view(record)
        if self._written.get(record.name) == view:
            self._unwritten.pop(record.name, None)
        else:
            self._unwritten[record.name] = view

    async def flush(self) -> None:
        """Write every queued status; one that fails stays queued for the next change."""
        for name, view in list(self._unwritten.items()):
            try:
                await self.backend.write_job_status(name, view)
            except Exception as error:  # the cluster may be unreachable for a while
                log.warning(
                    "could not write the status of %s: %r", name, error, extra={"job": name}
                )
                continue
            self._written[name] = view
            del self._unwritten[name]
