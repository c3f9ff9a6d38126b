"""Whether a generation's ``MASTER_ADDR`` resolves yet, for an agent about to start workers.

On Kubernetes' pod network ``MASTER_ADDR`` is the DNS name of replica 0's pod
(``<hostname>.<service>.<namespace>.svc``), whose record the cluster's DNS serves only
some time after the pod got its address; a worker that looks it up earlier fails its
rendezvous at once. So the agent waits for the name first, as Kubeflow's training
operator has each worker pod's init container wait until the master's name resolves.

``await until_resolves(host, seconds, on_wait)``: True at once where ``host`` is an IP
address; else True once it resolves, trying at once and then every
:data:`RETRY_SECONDS`, up to :data:`RETRY_MAX_SECONDS` apart; ``on_wait`` is awaited
once, when the first try fails (the caller says it waits); False when ``seconds`` pass
first (the workers then start anyway: their failure is a fault the ladder recovers).
``resolve`` is :meth:`asyncio.loop.getaddrinfo`'s shape, the system resolver unless a
caller passes another.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["RETRY_MAX_SECONDS", "RETRY_SECONDS", "is_address", "until_resolves"]

# First wait between tries, doubled after each up to RETRY_MAX_SECONDS: a record
# usually appears within a second or two of the pod's address.
RETRY_SECONDS = 0.05
RETRY_MAX_SECONDS = 1.0

Resolve = Callable[..., Awaitable[list[Any]]]


def is_address(host: str) -> bool:
    """Whether ``host`` is an IPv4 or IPv6 address (nothing to resolve)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def until_resolves(
    host: str,
    seconds: float,
    on_wait: Callable[[], Awaitable[None]],
    resolve: Resolve | None = None,
) -> bool:
    """Whether ``host`` resolves within ``seconds`` (module docstring)."""
    if is_address(host):
        return True
    loop = asyncio.get_running_loop()
    lookup = resolve or loop.getaddrinfo
    deadline = loop.time() + seconds
    pause, waiting = RETRY_SECONDS, False
    while True:
        try:
            async with asyncio.timeout(max(deadline - loop.time(), 0.0)):
                if await lookup(host, None, type=socket.SOCK_STREAM):
                    return True
        except (OSError, TimeoutError):  # socket.gaierror: not (yet) known
            pass
        if deadline - loop.time() <= 0:
            return False
        if not waiting:
            waiting = True
            await on_wait()
        await asyncio.sleep(min(pause, max(deadline - loop.time(), 0.0)))
        pause = min(pause * 2, RETRY_MAX_SECONDS)
