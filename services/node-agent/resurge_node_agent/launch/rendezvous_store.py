"""One generation's rendezvous store, hosted for its agent (a process of its own).

``python -m resurge_node_agent.launch.rendezvous_store FIFO``, started by
:class:`resurge_node_agent.launch.rendezvous.HostedStore`, never by hand, forked from the agent's
fork server: it uses the torch the server preloaded and imports none itself (the control
plane never does); without it, it exits 1 saying so.

It starts as a standby, ahead of the generation it will serve: it creates and drops one
store on a port of the kernel's choosing (the first store a forked process creates costs
tens of milliseconds of page faults and thread start; the next one about one) and says
``standby``. It then reads ``PORT WORLD_SIZE`` from the named pipe FIFO, once, and runs
torch's own c10d ``TCPStore`` server on PORT, on every interface, as a script's rank 0
would; the generation's workers get ``TORCHELASTIC_USE_AGENT_STORE=True`` and all connect
to it as clients (torch's ``env://`` rendezvous, as under torchrun's agent). It says on
stdout, one line each, once:

- ``listening``: the store accepts connections (the workers may start);
- ``joined``: all WORLD_SIZE ranks' store clients have joined it, which each rank does
  inside ``init_process_group`` (the clients' ``init/`` count, whatever the backend;
  nothing else in the store is common to gloo and nccl, nor needs
  ``TORCH_DIST_INIT_BARRIER``).

It exits 1 with a message on stderr when PORT is taken, and otherwise serves until it is
killed (it holds nothing to save).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

__all__ = ["JOINED", "LISTENING", "STANDBY", "main"]

STANDBY = "standby"
LISTENING = "listening"
JOINED = "joined"
# How often the store is probed until it accepts connections (it takes a millisecond).
_PROBE_SECONDS = 0.0005
# A joined store never times out: the workers' own timeouts govern the rendezvous.
_NO_TIMEOUT = timedelta(days=365)
_SAYING = threading.Lock()


def main(argv: Sequence[str]) -> int:
    """Stand by, read the port and world size from ``argv[0]``, serve the store; say when
    it listens and when every rank joined."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is None:
        print("torch is not imported: no rendezvous store", file=sys.stderr, flush=True)
        return 1
    TCPStore = distributed.TCPStore
    TCPStore("localhost", 0, None, True, timedelta(seconds=10), wait_for_workers=False)
    _say(STANDBY)
    with Path(argv[0]).open() as fifo:  # blocks until the agent opens it to write
        request = fifo.readline().split()
    if len(request) != 2:
        return 0  # the agent closed the pipe without a generation: not needed
    port, world_size = int(request[0]), int(request[1])
    taken = _taken(port)
    if taken is not None:
        print(f"rendezvous store port {port} is taken: {taken}", file=sys.stderr, flush=True)
        return 1
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(f"resurge rendezvous store port={port} ranks={world_size}")
    threading.Thread(target=_say_when_listening, args=(port,), daemon=True).start()
    # World size + 1: the server's own client counts itself in ``init/``, so the
    # constructor returns once every rank's client has joined (it waits in C++, in 10 ms
    # steps, without the GIL).
    store = TCPStore(
        "localhost", port, world_size + 1, is_master=True, timeout=_NO_TIMEOUT,
        wait_for_workers=True,
    )  # fmt: skip
    _say(JOINED)
    while store is not None:
        signal.pause()
    return 0


def _taken(port: int) -> str | None:
    """Why ``port`` cannot be listened on, or None (checked before the store binds it, so
    the probe never mistakes another process's listener for this store)."""
    try:
        probe = socket.socket(socket.AF_INET6)
    except OSError:
        probe = socket.socket(socket.AF_INET)
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            return str(error)
    return None


def _say_when_listening(port: int) -> None:
    while True:
        try:
            socket.create_connection(("localhost", port), timeout=1).close()
        except OSError:
            time.sleep(_PROBE_SECONDS)
            continue
        _say(LISTENING)
        return


def _say(line: str) -> None:
    with _SAYING:
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
