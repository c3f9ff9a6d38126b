"""Where durable detector state lives: the KV bucket ``<namespace>_detector_state``.

The detector service owns the bucket. Keys are ``<detector>.<job>.<key>``, each part
escaped as one subject token; entries expire 7 days after their last write.
:class:`StateStore` writes what the detectors' state changed (what fails stays unsaved
and is written next time) and, at start, gives every stored entry of the jobs this
replica judges back to its detector.
"""

from __future__ import annotations

import asyncio

import nats.js.errors
from nats.js.kv import KeyValue

from resurge.contract.subjects import escape_token, unescape_token
from resurge.runtime.bus import Bus
from resurge.runtime.kv_keys import bucket_keys
from resurge_detector.runtime import DetectorRuntime, StateKey

__all__ = ["STATE_BUCKET", "WRITES_IN_FLIGHT", "StateStore", "state_entry_key"]

STATE_BUCKET = "detector_state"
_STATE_MAX_AGE_SECONDS = 7 * 24 * 3600.0
# Writes of one save awaited together (a round trip each, not one after another).
WRITES_IN_FLIGHT = 128


def state_entry_key(detector: str, job: str, key: str) -> str:
    """The KV key of one durable state entry."""
    return ".".join(escape_token(part) for part in (detector, job, key))


class StateStore:
    """The detectors' durable state in the bucket, for one :class:`DetectorRuntime`."""

    def __init__(self, kv: KeyValue, runtime: DetectorRuntime) -> None:
        self.kv = kv
        self.runtime = runtime
        self._unsaved: dict[StateKey, bytes | None] = {}
        self._saving = asyncio.Lock()

    @classmethod
    async def open(cls, bus: Bus, runtime: DetectorRuntime) -> StateStore:
        """Create (or bind) the bucket on ``bus``'s server."""
        kv = await bus.create_bucket(STATE_BUCKET, history=1, ttl=_STATE_MAX_AGE_SECONDS)
        return cls(kv, runtime)

    async def save(self) -> None:
        """Write what the detectors' state changed; what fails is retried next time.

        One save at a time (both lanes and the tick save): the changes are taken and
        written in order, so an older value of a key is never written after a newer.
        Within a save each key is written once, so up to :data:`WRITES_IN_FLIGHT` writes
        wait for their acknowledgements together: a save holds the batch it follows
        (acked after it), and a job's new generation changes an entry per replica."""
        async with self._saving:
            self._unsaved.update(self.runtime.state_changes())
            changes = list(self._unsaved.items())
            for start in range(0, len(changes), WRITES_IN_FLIGHT):
                part = changes[start : start + WRITES_IN_FLIGHT]
                done = await asyncio.gather(
                    *(self._write(*c) for c in part), return_exceptions=True
                )
                failed: BaseException | None = None
                for (where, _), result in zip(part, done, strict=True):
                    if result is None:
                        del self._unsaved[where]
                    elif failed is None:
                        failed = result
                if failed is not None:
                    raise failed

    async def _write(self, where: StateKey, value: bytes | None) -> None:
        key = state_entry_key(*where)
        if value is None:
            await self.kv.delete(key)
        else:
            await self.kv.put(key, value)

    async def restore(self) -> int:
        """Hand every stored entry of the jobs this replica judges back to its detector;
        how many were taken."""
        restored = 0
        for name in await bucket_keys(self.kv):  # not kv.keys(): see resurge.runtime.kv_keys
            parts = name.split(".")
            if len(parts) != 3:
                continue
            try:
                entry = await self.kv.get(name)
            except nats.js.errors.KeyNotFoundError:  # deleted or expired meanwhile
                continue
            if entry.value:
                detector, job, key = (unescape_token(part) for part in parts)
                restored += self.runtime.restore_state(detector, job, key, entry.value)
        return restored
