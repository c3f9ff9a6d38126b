"""A TCP proxy a bench puts between one client and its server, to disturb the link.

:class:`Proxy` listens on a loopback port and forwards each connection it accepts to
``upstream`` (host, port), both ways, in one of these modes (:meth:`Proxy.set`, at any
time, for every connection, open or new):

- ``pass``: bytes go through as they come;
- ``delay``: every chunk arrives ``delay_ms`` later than it was sent, in order;
- ``blackhole``: a partition: connections stay open and nothing goes through either
  way. TCP never loses bytes inside a stream (it sends them again), so what was sent
  during the partition waits in the proxy and arrives once the link heals, if both
  ends still hold the connection; a new connection is accepted and hears nothing.

:meth:`Proxy.reset` aborts every open connection (an RST to both ends, as a middlebox
that forgot them); the mode stays. :meth:`Proxy.close` stops listening and aborts all.
Runs in the caller's event loop; standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MODES", "Proxy"]

MODES = ("pass", "delay", "blackhole")
_CHUNK = 65536


@dataclass
class Proxy:
    """Forwards connections on ``port`` (0: a free one, known after :meth:`start`) to
    ``upstream``, disturbed as :meth:`set` says."""

    upstream: tuple[str, int]
    name: str = "proxy"
    port: int = 0
    mode: str = "pass"
    delay_ms: float = 0.0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _healed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        """The NATS URL that reaches ``upstream`` through this proxy."""
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> Proxy:
        """Listen; return once connections are accepted."""
        self._healed.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def set(self, mode: str, delay_ms: float = 0.0) -> None:
        """Disturb every connection, open or new, as ``mode`` says (see the module)."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {MODES}")
        self.mode, self.delay_ms = mode, delay_ms
        if mode == "blackhole":
            self._healed.clear()
        else:
            self._healed.set()

    def reset(self) -> int:
        """Abort every open connection with an RST to both ends; the number aborted."""
        writers = list(self._writers)
        for writer in writers:
            _abort(writer)
        return len(writers) // 2

    async def close(self) -> None:
        """Stop listening and abort every connection."""
        if self._server is not None:
            self._server.close()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # closing: the handler just ends
            await self._connect(reader, writer)

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _abort(writer)
            return
        self._writers |= {writer, up_writer}
        pumps = [
            self._spawn(self._pump(reader, up_writer)),
            self._spawn(self._pump(up_reader, writer)),
        ]
        await asyncio.gather(*pumps, return_exceptions=True)
        self._writers -= {writer, up_writer}
        for end in (writer, up_writer):
            end.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: each chunk read is queued with the time it may be written; at
        the end of the stream the other side is closed once every chunk before it is out."""
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        writing = self._spawn(self._write(chunks, writer))
        try:
            while chunk := await reader.read(_CHUNK):
                due = time.monotonic() + (self.delay_ms / 1000 if self.mode == "delay" else 0)
                chunks.put_nowait((due, chunk))
        except OSError:  # reset
            writing.cancel()
            _abort(writer)
            return
        chunks.put_nowait((0.0, b""))
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await writing

    async def _write(
        self, chunks: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                due, chunk = await chunks.get()
                await self._healed.wait()  # a partition holds everything, in order
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)  # a delayed link: this chunk's due time
                await self._healed.wait()
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()
        except OSError:
            _abort(writer)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
