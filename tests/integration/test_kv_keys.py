"""Listing a KV bucket's keys through its stream (real nats-server)."""

import nats.js.errors
import pytest
from nats.js.api import KeyValueConfig

from resurge.runtime.bus import Bus
from resurge.runtime.kv_keys import bucket_keys


async def test_every_key_is_listed_and_a_deleted_one_reads_as_missing(bus: Bus) -> None:
    kv = await bus.js.create_key_value(KeyValueConfig(bucket=bus.subjects.kv_bucket("keys")))
    assert await bucket_keys(kv) == []
    for key in ("b", "a", "c_2e_d"):
        await kv.put(key, b"x")
    await kv.put("a", b"y")  # a second revision is still one key
    await kv.delete("b")
    assert await bucket_keys(kv) == ["a", "b", "c_2e_d"]
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get("b")
