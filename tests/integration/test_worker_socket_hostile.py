"""The launch agent's worker socket against clients that misbehave.

The real WorkerChannel on a real unix socket; the misbehaving clients are raw
connections, and the well-behaved worker is a real process using ``resurge.worker``.
Whatever the others do, that worker's reports keep arriving.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from resurge.worker.wire import MAX_LINE_BYTES
from resurge_node_agent.launch.worker_channel import (
    MAX_WRITE_BACKLOG_BYTES,
    WorkerChannel,
    socket_path_for,
)
from tests.integration.test_worker_channel import (
    WAIT,
    Reports,
    close_writer,
    hello,
    raw_connection,
    run_worker,
)

HELLO_TIMEOUT = 1.0
MAX_CONNECTIONS = 16

# A worker that reports 50 steps and a checkpoint, then exits.
STEADY_WORKER = """
from resurge import worker
run = worker.connect()
for step in range(50):
    run.progress(step, loss=1.0)
run.checkpoint_saved(50, "/ckpt/50")
run.close(timeout=10)
"""


@pytest.fixture
async def channel() -> AsyncIterator[tuple[WorkerChannel, Reports]]:
    reports = Reports()
    channel = WorkerChannel(
        socket_path_for("hostile", 0),
        reports.on_progress,
        reports.on_checkpoint,
        hello_timeout=HELLO_TIMEOUT,
        max_connections=MAX_CONNECTIONS,
    )
    await channel.start()
    yield channel, reports
    await channel.close()


async def steady_worker_reports(channel: WorkerChannel, reports: Reports, local_rank: int) -> None:
    """Run the steady worker; every one of its reports arrives, in order."""
    result = await run_worker(STEADY_WORKER, channel.path, local_rank=local_rank)
    assert result.returncode == 0, result.stderr
    assert await reports.next_checkpoint() == (local_rank, 50, "/ckpt/50")
    steps = [reports.progress.get_nowait() for _ in range(reports.progress.qsize())]
    assert [(rank, step) for rank, step, _ in steps] == [(local_rank, s) for s in range(50)]


async def closed_by_agent(reader: asyncio.StreamReader) -> bool:
    """Whether the agent ends the connection within WAIT (reading what it sent)."""
    try:
        async with asyncio.timeout(WAIT):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


async def until(condition: object, what: str) -> None:
    """Poll ``condition()`` until true, up to WAIT."""
    assert callable(condition)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def info(path: Path | str) -> os.stat_result | None:
    """``path``'s stat, None if nothing is there (a sync helper: local, instant)."""
    try:
        return Path(path).stat()
    except FileNotFoundError:
        return None


def abort(writer: asyncio.StreamWriter) -> None:
    """Hang up abruptly (a reset, not an orderly close)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- the socket's place --


async def test_socket_is_in_a_private_folder_and_both_go_on_close(
    channel: tuple[WorkerChannel, Reports],
) -> None:
    agent, _ = channel
    folder, sock = info(Path(agent.path).parent), info(agent.path)
    assert folder is not None
    assert sock is not None
    assert stat.S_IMODE(folder.st_mode) == 0o700
    assert folder.st_uid == os.getuid()
    assert stat.S_IMODE(sock.st_mode) == 0o600
    await agent.close()
    assert info(Path(agent.path).parent) is None


async def test_a_folder_open_to_others_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    reports = Reports()
    agent = WorkerChannel(str(shared / "agent.sock"), reports.on_progress, reports.on_checkpoint)
    with pytest.raises(PermissionError, match="open to other users"):
        await agent.start()
    assert not (shared / "agent.sock").exists()


async def test_an_existing_private_folder_is_used_and_kept(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    reports = Reports()
    agent = WorkerChannel(str(private / "agent.sock"), reports.on_progress, reports.on_checkpoint)
    await agent.start()
    await agent.close()
    assert private.is_dir()
    assert not (private / "agent.sock").exists()


# -- slow clients --


async def test_half_a_hello_then_silence_is_dropped_and_blocks_nobody(
    channel: tuple[WorkerChannel, Reports],
) -> None:
    agent, reports = channel
    reader, writer = await raw_connection(agent.path)
    writer.write(hello(local_rank=7)[:20])  # half a frame, then nothing
    await writer.drain()
    await steady_worker_reports(agent, reports, local_rank=0)
    assert await closed_by_agent(reader)
    assert agent.rejected["hello_timeout"] == 1
    await close_writer(writer)


async def test_half_a_line_after_hello_then_silence_blocks_nobody(
    channel: tuple[WorkerChannel, Reports],
) -> None:
    agent, reports = channel
    _, writer = await raw_connection(agent.path)
    writer.write(hello(local_rank=7) + b'{"type":"progress","step":1,"met')
    await writer.drain()
    await until(lambda: agent.worker(7) is not None, "the slow client's hello")
    await steady_worker_reports(agent, reports, local_rank=0)
    assert agent.worker(7) is not None  # a worker that has said hello may be quiet
    await close_writer(writer)


async def test_a_client_that_never_reads_is_cut_off_at_the_backlog_bound(
    channel: tuple[WorkerChannel, Reports],
) -> None:
    agent, reports = channel
    reader, writer = await raw_connection(agent.path)  # reads nothing from here on
    writer.write(hello(local_rank=7))
    await writer.drain()
    await until(lambda: agent.worker(7) is not None, "the deaf client's hello")
    line = b'{"type":"checkpoint_now","generation":0,"reason":"' + b"x" * 60_000 + b'"}\n'
    sent = 0
    while agent.send(7, line):
        sent += 1
        assert sent * len(line) < 4 * MAX_WRITE_BACKLOG_BYTES, "the backlog has no bound"
    assert agent.rejected["write_backlog"] == 1
    await steady_worker_reports(agent, reports, local_rank=0)
    assert await closed_by_agent(reader)
    await close_writer(writer)


# -- big and bad input --


async def test_an_endless_line_is_dropped_and_the_connection_goes_on(
    channel: tuple[WorkerChannel, Reports],
) -> None:
    agent, reports = channel
    _, writer = await raw_connection(agent.path)
    writer.write(hello(local_rank=3))
    for _ in range(64):  # 8 MiB without a newline, in pieces
        writer.write(b"y" * (128 * 1024))
        await writer.drain()
    writer.write(b'\n{"type":"progress","step":4,"metrics":{"loss":1}}\n')
    await writer.drain()
    assert await reports.next_progress() == (3, 4, {"loss": 1.0})
    assert agent.rejected == {"too_long": 1}
    await close_writer(writer)


async def test_many_connections_are_refused_past_the_bound_and_expire_without_hello(
    channel: tuple[WorkerChannel, Reports],
) -> None:
    agent, reports = channel
    clients = [await raw_connection(agent.path) for _ in range(MAX_CONNECTIONS + 8)]
    # The ones past the bound are closed at once; the rest, silent, after the hello timeout.
    for reader, _ in clients:
        assert await closed_by_agent(reader)
    assert agent.rejected["too_many_connections"] == 8
    assert agent.rejected["hello_timeout"] == MAX_CONNECTIONS
    await until(lambda: agent.connections == 0, "the silent connections to go")
    await steady_worker_reports(agent, reports, local_rank=1)
    for _, writer in clients:
        await close_writer(writer)


async def test_garbage_and_abrupt_hangups_alongside_a_real_worker(
    channel: tuple[WorkerChannel, Reports],
) -> None:
    agent, reports = channel
    junk = [
        os.urandom(4096),
        b"\x00" * 10_000 + b"\n",
        b"{" * 100_000 + b"\n",
        b'{"type":"hello","local_rank":' + b"9" * 5000 + b"}\n",
        hello(local_rank=5) + b'{"type":"progress","step":1,"metrics":{"a":' + b"[" * 50_000,
        b"\xff\xfe" + "ü".encode("utf-16") * 1000 + b"\n",
        b"\n" * 50_000,
    ]

    async def hostile(round_: int) -> None:
        for payload in junk:
            _, writer = await raw_connection(agent.path)
            writer.write(payload)
            if round_ % 2:
                abort(writer)
            else:
                await close_writer(writer)

    worker = asyncio.create_task(steady_worker_reports(agent, reports, local_rank=2))
    await asyncio.gather(*(hostile(i) for i in range(6)))
    await asyncio.wait_for(worker, WAIT)
    await until(lambda: agent.connections == 0, "the hostile connections to end")
    assert agent.rejected.get("not_json", 0) > 0
    # And it is still serving.
    await steady_worker_reports(agent, reports, local_rank=4)


async def test_lines_at_the_size_bound(channel: tuple[WorkerChannel, Reports]) -> None:
    agent, reports = channel
    _, writer = await raw_connection(agent.path)
    writer.write(hello(local_rank=0))
    head = b'{"type":"checkpoint","step":1,"path":"'
    fits = head + b"p" * (MAX_LINE_BYTES - len(head) - 3) + b'"}\n'
    assert len(fits) == MAX_LINE_BYTES
    writer.write(fits)
    writer.write(fits[:-3] + b'p"}\n')  # one byte over
    writer.write(b'{"type":"checkpoint","step":2,"path":"/c/2"}\n')
    await writer.drain()
    assert (await reports.next_checkpoint())[1] == 1
    assert await reports.next_checkpoint() == (0, 2, "/c/2")
    assert agent.rejected == {"too_long": 1}
    await close_writer(writer)
