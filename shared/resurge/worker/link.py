"""One worker's connection to its agent, kept by a daemon thread.

:class:`AgentLink` never blocks or raises in the caller's thread: :meth:`AgentLink.send`
only queues a line (see :mod:`resurge.worker.outbox`) and wakes the thread. The thread
connects to the unix socket, sends ``hello`` first on every connection, then the
queued lines in order, and hands every line the agent sends to ``on_line``. When the
connection breaks or the socket is missing it retries with backoff (50 ms doubling to
1 s), and lines queued meanwhile wait. :meth:`AgentLink.close` lets the thread send
what is queued for up to ``timeout`` seconds (making one more connection attempt if
it has none), then ends it; later sends are dropped. :meth:`AgentLink.set_hello`
changes the hello the next connection starts with (a worker that moved to a new
generation in-process).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

from resurge.worker.outbox import Item, Outbox
from resurge.worker.wire import MAX_LINE_BYTES

__all__ = ["AgentLink"]

_RETRY_FIRST = 0.05
_RETRY_MAX = 1.0
_CONNECT_TIMEOUT = 1.0
_SEND_CHUNK = 256 * 1024
# Keep a broken pipe an exception even where a program restored SIGPIPE's default.
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)


class AgentLink:
    """A worker's connection to its agent's unix socket, kept by a daemon thread."""

    def __init__(
        self,
        path: str,
        hello: bytes,
        on_line: Callable[[bytes], None],
        *,
        max_progress: int = 1024,
    ) -> None:
        self.path = path
        self.connected = False
        self._hello = hello
        self._on_line = on_line
        self._outbox = Outbox(max_progress)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closing = threading.Event()
        self._deadline = 0.0
        first = self._connect()  # in the caller's thread, so `connected` is true on return
        self.connected = first is not None
        self._thread = threading.Thread(
            target=self._run, args=(first,), name="resurge-agent-link", daemon=True
        )
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Progress lines dropped because too many waited."""
        return self._outbox.dropped

    @property
    def pending(self) -> int:
        """Lines queued and not yet handed to the socket."""
        return len(self._outbox)

    def set_hello(self, hello: bytes) -> None:
        """Say ``hello`` on every later connection."""
        self._hello = hello

    def send(self, line: bytes, *, droppable: bool) -> None:
        """Queue ``line`` and return at once; a ``droppable`` one may be dropped when too
        many wait."""
        if self._closing.is_set():
            return
        self._outbox.put(line, droppable=droppable)
        self._wake()

    def close(self, timeout: float) -> None:
        """Send what is queued for up to ``timeout`` seconds, then stop; idempotent."""
        if not self._closing.is_set():
            self._deadline = time.monotonic() + timeout
            self._closing.set()
            self._wake()
        self._thread.join(timeout + 0.5)
        if not self._thread.is_alive():
            self._wake_r.close()
            self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake is pending anyway) or closed
            self._wake_w.send(b"\0")

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(_CONNECT_TIMEOUT)
            sock.connect(self.path)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return None
        return sock

    def _run(self, sock: socket.socket | None) -> None:
        delay = _RETRY_FIRST
        while True:
            if sock is not None:
                delay = _RETRY_FIRST
                with sock:
                    self.connected = True
                    self._exchange(sock)
                    self.connected = False
            if self._closing.is_set():
                return
            self._closing.wait(delay)
            delay = min(delay * 2, _RETRY_MAX)
            sock = self._connect()

    def _exchange(self, sock: socket.socket) -> None:  # noqa: C901 — one select loop sharing its buffers
        """Talk on ``sock`` until it breaks, or until closing and flushed or past due."""
        hello = self._hello
        unsent: deque[Item] = deque([(True, hello)])  # lines in `buffer`, oldest first
        buffer = bytearray(hello)
        sent = 0  # bytes of unsent[0] already written
        received = bytearray()
        writing = False
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ)
            selector.register(sock, selectors.EVENT_READ)
            try:
                while True:
                    if not buffer:
                        taken = self._outbox.take(_SEND_CHUNK)
                        unsent.extend(taken)
                        buffer.extend(b"".join(line for _, line in taken))
                    timeout = None
                    if self._closing.is_set():
                        timeout = self._deadline - time.monotonic()
                        if not buffer or timeout <= 0:
                            return
                    if bool(buffer) != writing:
                        writing = bool(buffer)
                        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
                        selector.modify(sock, events)
                    for key, mask in selector.select(timeout):
                        if key.fileobj is self._wake_r:
                            self._drain_wakes()
                            continue
                        if mask & selectors.EVENT_READ and not self._receive(sock, received):
                            raise ConnectionResetError("the agent closed the connection")
                        if mask & selectors.EVENT_WRITE and buffer:
                            written = _send(sock, buffer)
                            del buffer[:written]
                            sent += written
                            while unsent and sent >= len(unsent[0][1]):
                                sent -= len(unsent.popleft()[1])
            except OSError:
                self._outbox.put_back([item for item in unsent if item[1] is not hello])

    def _drain_wakes(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass

    def _receive(self, sock: socket.socket, received: bytearray) -> bool:
        """Read what the agent sent and hand over complete lines; False at end of stream."""
        try:
            data = sock.recv(65536)
        except BlockingIOError:  # woken without data after all
            return True
        if not data:
            return False
        received.extend(data)
        *lines, rest = received.split(b"\n")
        received[:] = rest if len(rest) <= MAX_LINE_BYTES else b""
        for line in lines:
            if line.strip():
                with contextlib.suppress(Exception):  # a bad message must not end the link
                    self._on_line(bytes(line))
        return True


def _send(sock: socket.socket, data: bytearray) -> int:
    try:
        return sock.send(data, _SEND_FLAGS)
    except BlockingIOError:  # woken without room after all
        return 0
