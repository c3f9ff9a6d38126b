"""A TCP proxy for tests that can turn into a blackhole: a network partition, not a close.

:class:`BlackholeProxy` forwards every connection it accepts on a loopback port to
``upstream``. :meth:`BlackholeProxy.blackhole` stops forwarding, both ways, on every
open and new connection, without closing any: each end keeps its socket and hears
nothing, as across a partition or a dead NAT entry (a half-open connection). What
is sent meanwhile is dropped. :meth:`BlackholeProxy.heal` forwards again (new bytes).
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["BlackholeProxy"]


class BlackholeProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream``; see the module docstring."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.forwarding = True
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
        for reader, writer in ((client_r, server_w), (server_r, client_w)):
            pump = asyncio.create_task(self._pump(reader, writer))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if self.forwarding:
                    writer.write(data)
                    await writer.drain()
        if self.forwarding:  # a real close goes through; a blackhole keeps it open
            writer.close()
