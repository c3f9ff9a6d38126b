"""A launch agent's WorkerChannel and real worker processes using ``resurge.worker``."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from resurge.worker.wire import MAX_LINE_BYTES, Hello, stop_pending_line
from resurge_node_agent.launch.worker_channel import (
    SOCKET_PATH_MAX_BYTES,
    WorkerChannel,
    socket_path_for,
)

WAIT = 20.0

# Waits (bounded) for the agent's stop notice, then says which one it got.
AWAIT_STOP = """
import sys, time
from resurge import worker
run = worker.connect()
run.progress(1, loss=1.0)
for _ in range(2000):
    if run.stop_pending:
        print("stop:", run.stop_reason, flush=True)
        sys.exit(0)
    time.sleep(0.01)
sys.exit(3)
"""


class Reports:
    """What the channel's callbacks received, as queues a test awaits."""

    def __init__(self) -> None:
        self.progress: asyncio.Queue[tuple[int, int, dict[str, float]]] = asyncio.Queue()
        self.checkpoints: asyncio.Queue[tuple[int, int, str]] = asyncio.Queue()

    async def on_progress(self, local_rank: int, step: int, metrics: dict[str, float]) -> None:
        await self.progress.put((local_rank, step, metrics))

    async def on_checkpoint(self, local_rank: int, step: int, path: str) -> None:
        await self.checkpoints.put((local_rank, step, path))

    async def next_progress(self) -> tuple[int, int, dict[str, float]]:
        return await asyncio.wait_for(self.progress.get(), WAIT)

    async def next_checkpoint(self) -> tuple[int, int, str]:
        return await asyncio.wait_for(self.checkpoints.get(), WAIT)


@dataclass
class Agent:
    channel: WorkerChannel
    reports: Reports


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    reports = Reports()
    channel = WorkerChannel(
        socket_path_for("test.job/with dots", 0), reports.on_progress, reports.on_checkpoint
    )
    await channel.start()
    yield Agent(channel, reports)
    await channel.close()


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def worker_env(
    socket: str | None, *, rank: int, local_rank: int, generation: int
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESURGE_")}
    env.update(RANK=str(rank), LOCAL_RANK=str(local_rank), RESURGE_GENERATION=str(generation))
    if socket is not None:
        env["RESURGE_AGENT_SOCKET"] = socket
    return env


async def start_worker(
    code: str, socket: str | None, *, rank: int = 0, local_rank: int = 0, generation: int = 0
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        env=worker_env(socket, rank=rank, local_rank=local_rank, generation=generation),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish(proc: asyncio.subprocess.Process) -> Finished:
    try:
        out, err = await asyncio.wait_for(proc.communicate(), WAIT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Finished(proc.returncode, out.decode(), err.decode())


async def run_worker(code: str, socket: str | None, **place: int) -> Finished:
    return await finish(await start_worker(code, socket, **place))


async def raw_connection(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(path)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


def hello(local_rank: int, generation: int = 0) -> bytes:
    return (
        f'{{"type":"hello","local_rank":{local_rank},"rank":{local_rank},'
        f'"pid":{os.getpid()},"generation":{generation}}}\n'
    ).encode()


def file_mode(path: str) -> int | None:
    """The mode of ``path``, None if there is nothing there (a sync helper: local, instant)."""
    try:
        return Path(path).stat().st_mode
    except FileNotFoundError:
        return None


def remove(path: str) -> None:
    Path(path).unlink(missing_ok=True)


# -- the socket --


async def test_socket_is_short_private_and_removed_on_close() -> None:
    path = socket_path_for("a" * 500, 12)
    assert len(os.fsencode(path)) <= SOCKET_PATH_MAX_BYTES
    assert path != socket_path_for("a" * 500, 12)
    reports = Reports()
    channel = WorkerChannel(path, reports.on_progress, reports.on_checkpoint)
    await channel.start()
    mode = file_mode(path)
    assert mode is not None
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    folder = file_mode(str(Path(path).parent))
    assert folder is not None
    assert stat.S_ISDIR(folder)
    assert stat.S_IMODE(folder) == 0o700
    await channel.close()
    assert file_mode(path) is None
    assert file_mode(str(Path(path).parent)) is None
    await channel.close()


async def test_a_path_too_long_for_a_socket_is_refused(tmp_path: Path) -> None:
    reports = Reports()
    channel = WorkerChannel(str(tmp_path / ("x" * 120)), reports.on_progress, reports.on_checkpoint)
    with pytest.raises(ValueError, match="at most 107"):
        await channel.start()


# -- reports --


async def test_progress_and_checkpoint_arrive_with_each_workers_local_rank(agent: Agent) -> None:
    code = """
import time
from resurge import worker
run = worker.connect()
print(run.connected)
run.progress(1, loss=0.5)
run.progress(2, loss=0.25, tokens=4096)
run.checkpoint_saved(2, f"/ckpt/rank-{run.rank}/step-2")
started = time.monotonic()
run.close(timeout=10)  # returns once the queue is sent, not at the timeout
print(run.connected, time.monotonic() - started < 5)
"""
    finished = await asyncio.gather(
        run_worker(code, agent.channel.path, rank=4, local_rank=0, generation=1),
        run_worker(code, agent.channel.path, rank=5, local_rank=1, generation=1),
    )
    for result in finished:
        assert (result.returncode, result.stdout.split()) == (0, ["True", "False", "True"]), (
            result.stderr
        )
    progress = sorted([await agent.reports.next_progress() for _ in range(4)])
    assert progress == [
        (0, 1, {"loss": 0.5}),
        (0, 2, {"loss": 0.25, "tokens": 4096.0}),
        (1, 1, {"loss": 0.5}),
        (1, 2, {"loss": 0.25, "tokens": 4096.0}),
    ]
    checkpoints = sorted([await agent.reports.next_checkpoint() for _ in range(2)])
    assert checkpoints == [(0, 2, "/ckpt/rank-4/step-2"), (1, 2, "/ckpt/rank-5/step-2")]
    assert agent.channel.rejected == {}


async def test_checkpoint_just_before_exit_is_not_lost(agent: Agent) -> None:
    # No close(): the interpreter's exit flushes the queue.
    code = """
from resurge import worker
run = worker.connect()
for step in range(300):
    run.progress(step, loss=1.0 / (step + 1))
run.checkpoint_saved(300, "/ckpt/step-300")
"""
    result = await run_worker(code, agent.channel.path, rank=3, local_rank=3)
    assert result.returncode == 0, result.stderr
    assert await agent.reports.next_checkpoint() == (3, 300, "/ckpt/step-300")
    steps = [agent.reports.progress.get_nowait()[1] for _ in range(agent.reports.progress.qsize())]
    assert steps == list(range(300))  # in order, none dropped, all before the checkpoint


async def test_a_stuck_agent_never_blocks_the_worker() -> None:
    """The agent stops reading; the worker keeps going and drops its oldest progress."""
    release = asyncio.Event()
    first = asyncio.Event()

    async def on_progress(_local_rank: int, _step: int, _metrics: dict[str, float]) -> None:
        first.set()
        await release.wait()

    async def on_checkpoint(_local_rank: int, _step: int, _path: str) -> None:
        return None

    code = """
from resurge import worker
run = worker.connect()
for step in range(50_000):
    run.progress(step, loss=0.125, throughput=1234.5)
run.checkpoint_saved(50_000, "/ckpt/50000")
print(run.connected, run.dropped_progress > 0)
run.close(timeout=0.2)
"""
    channel = WorkerChannel(socket_path_for("stuck", 0), on_progress, on_checkpoint)
    await channel.start()
    try:
        result = await run_worker(code, channel.path)
        assert (result.returncode, result.stdout.split()) == (0, ["True", "True"]), result.stderr
        await asyncio.wait_for(first.wait(), WAIT)
    finally:
        release.set()
        await channel.close()


# -- stop notices --


async def test_stop_pending_reaches_a_running_worker(agent: Agent) -> None:
    proc = await start_worker(AWAIT_STOP, agent.channel.path, rank=6, local_rank=2, generation=5)
    assert await agent.reports.next_progress() == (2, 1, {"loss": 1.0})
    assert agent.channel.workers == [Hello(local_rank=2, rank=6, pid=proc.pid, generation=5)]
    assert await agent.channel.notify_stop_pending(4, "an older generation") == 0
    assert await agent.channel.notify_stop_pending(5, "resize to 3 replicas") == 1
    result = await finish(proc)
    assert (result.returncode, result.stdout) == (0, "stop: resize to 3 replicas\n"), result.stderr


async def test_stop_pending_reaches_a_worker_that_connects_later(agent: Agent) -> None:
    assert await agent.channel.notify_stop_pending(2, "draining") == 0
    result = await run_worker(AWAIT_STOP, agent.channel.path, generation=2)
    assert (result.returncode, result.stdout) == (0, "stop: draining\n"), result.stderr


async def test_worker_ignores_garbage_and_notices_for_older_generations() -> None:
    """Against a bare socket server standing in for an agent that sends odd things."""
    hello_seen = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        hello_seen.set()
        writer.write(b"garbage\n" + b'{"type":"from_the_future"}\n')
        writer.write(stop_pending_line(4, "for generation 4"))
        writer.write(stop_pending_line(5, "for generation 5"))
        await writer.drain()
        await reader.read()  # until the worker hangs up
        writer.close()

    path = socket_path_for("bare", 0)
    Path(path).parent.mkdir(mode=0o700)
    server = await asyncio.start_unix_server(serve, path=path)
    try:
        result = await run_worker(AWAIT_STOP, path, generation=5)
        assert hello_seen.is_set()
        assert (result.returncode, result.stdout) == (0, "stop: for generation 5\n"), result.stderr
    finally:
        server.close()
        await server.wait_closed()
        remove(path)
        Path(path).parent.rmdir()


# -- bad input --


async def test_garbage_is_counted_by_reason_and_the_channel_keeps_serving(agent: Agent) -> None:
    _, writer = await raw_connection(agent.channel.path)
    writer.write(b'{"type":"progress","step":1,"metrics":{}}\n')  # before hello
    writer.write(hello(local_rank=2))
    writer.write(b"this is not json\n")
    writer.write(b"[1, 2, 3]\n")
    writer.write(b'{"type":"launch_missiles"}\n')
    writer.write(b'{"type":"progress","step":-4,"metrics":{}}\n')
    writer.write(b'{"type":"checkpoint","step":"4","path":"/ckpt"}\n')
    writer.write(b'{"type":"progress","step":1,"metrics":' + b" " * MAX_LINE_BYTES + b"{}}\n")
    writer.write(hello(local_rank=3))
    writer.write(b"\n   \n")  # blank lines are not messages
    writer.write(b'{"type":"progress","step":7,"metrics":{"loss":2}}\n')
    await writer.drain()
    assert await agent.reports.next_progress() == (2, 7, {"loss": 2.0})
    assert agent.channel.rejected == {
        "no_hello": 1,
        "not_json": 1,
        "not_object": 1,
        "unknown_type": 1,
        "bad_field": 2,
        "too_long": 1,
        "repeated_hello": 1,
    }
    await close_writer(writer)

    result = await run_worker(
        "from resurge import worker\nworker.connect().checkpoint_saved(9, '/ckpt/9')\n",
        agent.channel.path,
        local_rank=1,
    )
    assert result.returncode == 0, result.stderr
    assert await agent.reports.next_checkpoint() == (1, 9, "/ckpt/9")
    assert agent.reports.progress.empty()


async def test_each_reason_is_logged_once_a_minute(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="resurge_node_agent.launch.worker_channel")
    _, writer = await raw_connection(agent.channel.path)
    writer.write(b"nope\n" * 3 + b"[]\n" + hello(local_rank=0))
    writer.write(b'{"type":"progress","step":1,"metrics":{}}\n')
    await writer.drain()
    assert await agent.reports.next_progress() == (0, 1, {})
    assert agent.channel.rejected == {"not_json": 3, "not_object": 1}
    reasons = [getattr(record, "reason", "") for record in caplog.records]
    assert sorted(reasons) == ["not_json", "not_object"]
    await close_writer(writer)


async def test_last_line_without_newline_is_read(agent: Agent) -> None:
    _, writer = await raw_connection(agent.channel.path)
    writer.write(hello(local_rank=4) + b'{"type":"checkpoint","step":5,"path":"/c/5"}')
    await close_writer(writer)
    assert await agent.reports.next_checkpoint() == (4, 5, "/c/5")


async def test_a_failing_callback_does_not_end_the_connection() -> None:
    seen: asyncio.Queue[int] = asyncio.Queue()

    async def on_progress(_local_rank: int, step: int, _metrics: dict[str, float]) -> None:
        if step == 1:
            raise RuntimeError("the bus is down")
        await seen.put(step)

    async def on_checkpoint(_local_rank: int, _step: int, _path: str) -> None:
        return None

    channel = WorkerChannel(socket_path_for("failing", 0), on_progress, on_checkpoint)
    await channel.start()
    try:
        _, writer = await raw_connection(channel.path)
        writer.write(hello(local_rank=0))
        writer.write(b'{"type":"progress","step":1,"metrics":{}}\n')
        writer.write(b'{"type":"progress","step":2,"metrics":{}}\n')
        await writer.drain()
        assert await asyncio.wait_for(seen.get(), WAIT) == 2
        await close_writer(writer)
    finally:
        await channel.close()


# -- no agent, or an agent that comes back --


async def test_worker_runs_when_its_agent_socket_does_not_exist(tmp_path: Path) -> None:
    code = """
import time
from resurge import worker
run = worker.connect()
print(run.connected)
run.progress(1, loss=0.5)
run.checkpoint_saved(1, "/ckpt/1")
started = time.monotonic()
run.close(timeout=10)
print(time.monotonic() - started < 5)
"""
    result = await run_worker(code, str(tmp_path / "no-agent-here.sock"))
    assert (result.returncode, result.stdout.split()) == (0, ["False", "True"]), result.stderr
    assert result.stderr == ""


async def test_worker_reconnects_to_a_restarted_agent() -> None:
    code = """
import sys, time
from resurge import worker
run = worker.connect()
for step in range(6000):
    run.progress(step)
    if run.stop_pending:
        run.checkpoint_saved(step, "/ckpt/last")
        sys.exit(0)
    time.sleep(0.005)
sys.exit(3)
"""
    path = socket_path_for("restarted", 0)
    first, second = Reports(), Reports()
    channel = WorkerChannel(path, first.on_progress, first.on_checkpoint)
    await channel.start()
    proc = await start_worker(code, path, local_rank=1)
    try:
        assert (await first.next_progress())[0] == 1
    finally:
        await channel.close()
    channel = WorkerChannel(path, second.on_progress, second.on_checkpoint)
    await channel.start()
    try:
        assert (await second.next_progress())[0] == 1  # hello again, on the new connection
        assert await channel.notify_stop_pending(0, "restart") == 1
        result = await finish(proc)
        assert result.returncode == 0, result.stderr
        local_rank, _, checkpoint = await second.next_checkpoint()
        assert (local_rank, checkpoint) == (1, "/ckpt/last")
        assert channel.rejected == {}
    finally:
        await channel.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
