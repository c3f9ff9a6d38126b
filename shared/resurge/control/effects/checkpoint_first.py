"""Ask a job for a checkpoint and wait for it: before a resize, before a planned move.

:func:`checkpoint_first` sends CheckpointNow to every replica of the job's current
generation (:func:`resurge.control.effects.job_messages.send_checkpoint_requests`), then
watches the job's record until the restarter has counted a checkpoint newer than the
one it had (every rank saved it), at most ``bound`` seconds. Workers that do not use
``resurge.worker`` never answer: the wait then runs out, and the caller goes on from the
newest complete checkpoint, as it would have without asking.

``hold_seconds`` (callers that stop the generation next: a move off a node) asks the
workers to hold after saving, until that stop (or an in-process restart) comes, at most
that long after the request reached them: so the generation trains no step past the
checkpoint it will resume from. It should outlast ``bound`` and the time the caller's
stop takes to arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from resurge.control.effects.job_messages import send_checkpoint_requests
from resurge.control.state.records import JobRecord, JobStore
from resurge.runtime.bus import Bus

__all__ = ["checkpoint_first"]


async def checkpoint_first(
    bus: Bus,
    store: JobStore,
    record: JobRecord,
    reason: str,
    bound: float,
    log: logging.Logger,
    *,
    hold_seconds: float = 0.0,
) -> bool:
    """Ask ``record``'s job for a checkpoint (``reason`` in words; the workers to hold
    after it for at most ``hold_seconds``) and wait at most ``bound`` seconds for every
    rank to have saved one newer than the record's; False if the job moved to another
    generation meanwhile (a fault won), else True (a newer checkpoint, or the wait ran
    out: logged)."""
    had = -1 if record.latest_checkpoint is None else record.latest_checkpoint.step
    watcher = await store.kv.watch(store.key(record.name))
    try:
        await send_checkpoint_requests(bus, record, reason, hold_seconds)
        async with asyncio.timeout(bound):
            async for entry in watcher:
                if entry is None or not entry.value:
                    continue
                now = JobRecord.from_entry(entry.value)
                if now.generation != record.generation:
                    return False
                if now.latest_checkpoint is not None and now.latest_checkpoint.step > had:
                    return True
    except TimeoutError:
        log.warning(
            "%s: no new checkpoint from every rank within %g s (%s); going on from step %s",
            record.name,
            bound,
            reason,
            had if had >= 0 else "0 (none)",
            extra={"job": record.name},
        )
    finally:
        with contextlib.suppress(Exception):
            await watcher.stop()  # type: ignore[no-untyped-call]  # nats.py: untyped
    return True
