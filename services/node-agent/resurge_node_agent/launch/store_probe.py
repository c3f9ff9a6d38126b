"""Whether a generation's rendezvous store accepts connections yet, for an agent that
does not host it.

torch's c10d ``TCPStore`` client that finds nothing listening sleeps before it tries
again: 0.25 to 0.75 s at first, half as long again each time after (torch 2.13's
``ExponentialBackoffWithJitter``), with no setting to change it. A worker that connects
a millisecond before its generation's store listens therefore starts that generation
about half a second late, and every rank with it. The agent that hosts the store starts
its own workers once the store said it listens; the agent of every other replica calls
:func:`until_listening` before it starts its workers, so no worker's first connect is
refused.

``await until_listening(host, port, seconds, on_wait)``: True once a TCP connection to
``host:port`` succeeds (it is closed at once: the store serves it as a client that
left), trying at once and then every :data:`RETRY_SECONDS`; ``on_wait`` is awaited once,
when the first try is refused (the caller says it waits); False when ``seconds`` pass
first (the workers then start anyway, and torch's own retries take over).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

__all__ = ["RETRY_SECONDS", "until_listening"]

# Between tries while nothing listens: a refused connect costs tens of microseconds
# here, a store from a standby process comes up within milliseconds.
RETRY_SECONDS = 0.002


async def until_listening(
    host: str, port: int, seconds: float, on_wait: Callable[[], Awaitable[None]]
) -> bool:
    """Whether ``host:port`` accepts a connection within ``seconds`` (module docstring)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    waiting = False
    while True:
        left = deadline - loop.time()
        try:
            async with asyncio.timeout(max(left, 0.0)):
                _, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError):
            if deadline - loop.time() <= 0:
                return False
            if not waiting:
                waiting = True
                await on_wait()
            await asyncio.sleep(RETRY_SECONDS)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
