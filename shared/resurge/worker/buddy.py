"""Buddy copies of sharded state: each rank's snapshot also kept in a peer's node memory.

With sharded state (FSDP, ZeRO) a node lost is a shard lost, unless another node holds a
copy. Each rank therefore sends every snapshot it writes to its buddy, the rank one node
further round the ring (``(rank + local_world_size) % world_size``; none when the whole
job is on one node), which keeps it in its own snapshot folder under the shard's key, so
:func:`resurge.worker.live_copy.plan` finds the shard live there. A node and its buddy
lost together leave the shard with no copy: the disk then.

The copies go over plain TCP, not the training's process group, so they never wait on
or race with its collectives, and outlive its teardown between generations:
:class:`BuddyServer` (one per process, a daemon thread) accepts
``<header JSON line><bytes>`` and writes the bytes to the folder; :func:`send_copy` sends
one. Every header carries the generation's token, which only the ranks of the process
group learn (gathered with the addresses when the generation restores): a copy without
it is refused, since a snapshot is loaded with ``torch.load``. A copy is sent as part of
its snapshot's write, so the optimizer's next step waits for it too (the buddy holds step
N before step N + 1 changes anything); one that cannot be sent (the buddy gone) is
dropped with a line on stderr, after :data:`SEND_SECONDS` at most, and so is one the buddy
refuses (past its folder's memory budget, or without the token: the reason comes back);
each reason is said once until a copy to that buddy goes through again.

Standard library only.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from resurge.worker.snapshot_folder import SnapshotFolder

__all__ = ["SEND_SECONDS", "Buddy", "BuddyServer", "buddy_of", "reachable_host", "send_copy"]

SEND_SECONDS = 10.0
_MAX_HEADER = 4096


@dataclass(frozen=True)
class Buddy:
    """Where to send this rank's copies: the buddy's address and the generation's token."""

    rank: int
    host: str
    port: int
    token: str


def buddy_of(rank: int, world_size: int, local_world_size: int) -> int | None:
    """The rank one node further round the ring; None when every rank is on one node."""
    if local_world_size < 1 or world_size <= local_world_size:
        return None
    return (rank + local_world_size) % world_size


def reachable_host(toward: str, port: int) -> str:
    """This machine's address on the route to ``toward`` (the master): the one peers
    reach it at (no packet is sent)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((toward, port or 1))
        return str(probe.getsockname()[0])
    return "127.0.0.1"


class BuddyServer:
    """Takes copies from this rank's wards into ``folder`` (see the module docstring)."""

    def __init__(self, folder: SnapshotFolder) -> None:
        self.folder = folder
        self.tokens: set[str] = set()
        self.received = 0
        self.refused = 0
        # Every interface: the peers that send copies are on other nodes.
        self._listener = socket.create_server(("0.0.0.0", 0))
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, name="resurge-buddy", daemon=True)
        self._thread.start()

    def accept_token(self, token: str) -> None:
        """Take copies that carry ``token`` (this generation's) from now on."""
        self.tokens = {token}

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._take, args=(connection,), daemon=True).start()

    def _take(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as stream:
            connection.settimeout(SEND_SECONDS)
            try:
                header = json.loads(stream.readline(_MAX_HEADER))
                key, step, size = str(header["key"]), int(header["step"]), int(header["size"])
                token = str(header["token"])
            except (OSError, ValueError, KeyError, TypeError):
                self.refused += 1
                return
            if not any(hmac.compare_digest(token, known) for known in self.tokens):
                self.refused += 1
                with contextlib.suppress(OSError):
                    connection.sendall(b"refused: not this generation's token\n")
                return
            if "/" in key or key.startswith(".") or step < 0 or size < 0:
                self.refused += 1
                return

            def save(path: Path) -> None:
                left = size
                with path.open("wb") as out:
                    while left:
                        chunk = stream.read(min(left, 1 << 20))
                        if not chunk:
                            raise OSError("the copy ended early")
                        out.write(chunk)
                        left -= len(chunk)

            try:
                self.folder.write(key, step, save, size)
            except OSError as error:  # past the budget, memory full: the sender says so
                self.refused += 1
                with contextlib.suppress(OSError):
                    reason = str(error).replace("\n", " ")[:_MAX_HEADER]
                    connection.sendall(f"refused: {reason}\n".encode())
                    while size > 0 and (chunk := stream.read(min(size, 1 << 20))):
                        size -= len(chunk)  # read to the end: the sender then hears why
                return
            self.received += 1
            with contextlib.suppress(OSError):
                connection.sendall(b"ok\n")

    def close(self) -> None:
        """Stop taking copies."""
        with contextlib.suppress(OSError):
            self._listener.close()


def send_copy(buddy: Buddy, key: str, step: int, path: Path) -> bool:
    """Send the snapshot at ``path`` to ``buddy``; True once it confirmed keeping it."""
    try:
        size = path.stat().st_size
        header = {"key": key, "step": step, "size": size, "token": buddy.token}
        with socket.create_connection((buddy.host, buddy.port), timeout=SEND_SECONDS) as out:
            out.sendall(json.dumps(header).encode() + b"\n")
            refused_early = contextlib.suppress(BrokenPipeError, ConnectionResetError)
            with refused_early, path.open("rb") as source:
                out.sendfile(source)
            reply = out.makefile("rb").readline(_MAX_HEADER).decode(errors="replace").strip()
    except OSError as error:
        reply = str(error)
    if reply == "ok":
        _said.difference_update({said for said in _said if said[0] == buddy.rank})
        return True
    if (buddy.rank, reply) not in _said:  # once until a copy to that buddy goes through
        _said.add((buddy.rank, reply))
        print(
            f"resurge.worker: the copy of {key} at step {step} was not kept by rank "
            f"{buddy.rank} ({buddy.host}:{buddy.port}): {reply or 'no answer'}",
            file=sys.stderr,
            flush=True,
        )
    return False


# (buddy, reply) of the failed copies said (each said again only after one went through).
_said: set[tuple[int, str]] = set()


def new_token() -> str:
    """A token for one generation's copies."""
    return os.urandom(16).hex()
