"""A TCP proxy for tests that can turn into a blackhole: a network partition, not a close.

:class:`BlackholeProxy` forwards every connection it accepts on a loopback port to
``upstream``. :meth:`BlackholeProxy.blackhole` stops forwarding, both ways, on every
open and new connection, without closing any: each end keeps its socket and hears
nothing, as across a partition or a dead NAT entry (a half-open connection). What
is sent meanwhile is dropped. :meth:`BlackholeProxy.heal` forwards again (new bytes).
:meth:`BlackholeProxy.reset_on` arms a reset instead: the first client chunk that holds
the given bytes is not forwarded, and every connection is aborted with an RST to both
ends (a server or middlebox that resets the link at that moment).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

__all__ = ["BlackholeProxy", "ThreadedProxy", "proxy_in_thread"]


class BlackholeProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream``; see the module docstring."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.forwarding = True
        self.resets = 0
        self._reset_marker: bytes | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> BlackholeProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def blackhole(self) -> None:
        self.forwarding = False

    def heal(self) -> None:
        self.forwarding = True

    def reset_on(self, marker: bytes) -> None:
        """Reset every connection when a client next sends ``marker``; counted in ``resets``."""
        self._reset_marker = marker

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        self._writers.add(server_w)
        for reader, writer, upstream in ((client_r, server_w, True), (server_r, client_w, False)):
            pump = asyncio.create_task(self._pump(reader, writer, upstream))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if upstream and self._reset_marker is not None and self._reset_marker in data:
                    self._reset_marker = None
                    self.resets += 1
                    for end in list(self._writers):
                        _abort(end)
                    return
                if self.forwarding:
                    writer.write(data)
                    await writer.drain()
        if self.forwarding:  # a real close goes through; a blackhole keeps it open
            writer.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.contextmanager
def proxy_in_thread(upstream: tuple[str, int]) -> Iterator[ThreadedProxy]:
    """A :class:`BlackholeProxy` on an event loop of its own thread, for a test that is
    not a coroutine (one that drives a service process); closed on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="proxy", daemon=True)
    thread.start()
    proxy = asyncio.run_coroutine_threadsafe(BlackholeProxy(upstream).start(), loop).result()
    try:
        yield ThreadedProxy(proxy, loop)
    finally:
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


class ThreadedProxy:
    """A :class:`BlackholeProxy` driven from another thread: its calls run on its loop."""

    def __init__(self, proxy: BlackholeProxy, loop: asyncio.AbstractEventLoop) -> None:
        self._proxy = proxy
        self._loop = loop
        self.url = proxy.url

    @property
    def resets(self) -> int:
        return self._proxy.resets

    def reset_on(self, marker: bytes) -> None:
        """Arm the reset; armed when this returns."""

        async def arm() -> None:
            self._proxy.reset_on(marker)

        asyncio.run_coroutine_threadsafe(arm(), self._loop).result()
