"""Every key of a JetStream KV bucket, without the race in nats.py's ``KeyValue.keys()``.

nats.py's ``keys()`` starts an ordered consumer and decides it has seen everything
when the server reports nothing pending and the client has counted no delivery; a
message already on its way (pending 0 on the server, not yet counted by the client)
makes it return no keys at all. Seen here right after a nats-server restart: a job
record that existed was missed. The bucket's stream knows its subjects: asking the
stream (``STREAM.INFO`` with a subjects filter) has no such window. Keys whose newest
entry is a delete marker are listed too; reading them raises ``KeyNotFoundError``.
"""

from __future__ import annotations

from nats.js.kv import KeyValue

__all__ = ["bucket_keys"]


async def bucket_keys(kv: KeyValue) -> list[str]:
    """The bucket's keys, sorted (KV convention: stream ``KV_<bucket>``, subjects
    ``$KV.<bucket>.<key>``; nats.py keeps both on the KeyValue)."""
    prefix: str = kv._pre
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{prefix}>")
    return sorted(subject[len(prefix) :] for subject in info.state.subjects or {})
