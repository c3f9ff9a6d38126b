"""The agent's wait for MASTER_ADDR's DNS name (resurge_node_agent.launch.master_name)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from resurge_node_agent.launch.master_name import is_address, until_resolves


class Waits:
    """Counts ``on_wait`` calls."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self) -> None:
        self.count += 1


async def test_an_address_is_not_looked_up() -> None:
    waits = Waits()

    async def never(*args: Any, **kwargs: Any) -> list[Any]:
        raise AssertionError("looked up")

    assert is_address("10.0.0.7") and is_address("fd00::1") and not is_address("a.b.svc")
    assert await until_resolves("10.0.0.7", 0.1, waits, resolve=never)
    assert waits.count == 0


async def test_a_name_that_resolves_is_not_waited_for() -> None:
    waits = Waits()
    assert await until_resolves("localhost", 5, waits)
    assert waits.count == 0


async def test_a_name_that_never_resolves_is_waited_for_until_the_bound() -> None:
    """``.invalid`` never resolves (RFC 2606), with the system's resolver."""
    waits = Waits()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await until_resolves("replica-0.no-such-job.invalid", 0.5, waits)
    assert waits.count == 1
    assert 0.5 <= loop.time() - started < 5


async def test_a_record_that_appears_late_is_waited_for_once() -> None:
    """A resolver whose record appears on the fourth lookup: no DNS server here can be
    told to add one, so the lookup is a stand-in with getaddrinfo's shape."""
    waits, lookups = Waits(), []

    async def late(host: str, port: object, **kwargs: Any) -> list[Any]:
        lookups.append(host)
        if len(lookups) < 4:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", 0))]

    assert await until_resolves("ddp-0-1a2b3.ddp.default.svc", 10, waits, resolve=late)
    assert waits.count == 1 and lookups == ["ddp-0-1a2b3.ddp.default.svc"] * 4
