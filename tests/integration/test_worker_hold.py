"""A worker asked to hold after its checkpoint (``checkpoint_now`` with ``hold_seconds``),
against a real WorkerChannel (the agent's end of the socket): it holds in
``checkpoint_saved`` until a stop ends its process, an in-process restart comes, or the
hold runs out; a stop notice does not end it, and a request without a hold does not hold.

Workers are this test process (``WorkerRun`` on a thread, where what it writes to
stderr is watched) or real subprocesses, stopped with SIGTERM as the agent stops them.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import AsyncIterator

import pytest

from resurge.worker import WorkerRun
from resurge.worker.wire import (
    CheckpointReport,
    ProgressReport,
    Rejoining,
    StopPending,
    checkpoint_now_line,
    restart_line,
)
from tests.integration.test_worker_channel import WAIT, finish, start_worker
from tests.integration.test_worker_checkpoint_requests import Agent

HOLDING = "holding after the checkpoint"

# Waits (bounded) for a checkpoint request, saves step 1, then says it went on. Under
# `restartable` (HOW), a later generation says it entered and returns.
SAVING = """
import sys, time
from resurge import worker

def body(run):
    if run.generation > 0:
        print("entered", run.generation, flush=True)
        return 0
    run.progress(1, loss=1.0)
    for _ in range(2000):
        if run.checkpoint_requested():
            break
        time.sleep(0.01)
    else:
        return 3
    run.checkpoint_saved(1, "/ckpt/step-1")
    print("went on", run.generation, flush=True)
    return 0

if HOW == "connect":
    sys.exit(body(worker.connect()))
sys.exit(worker.restartable(body)())
"""


class Stderr:
    """Stands in for ``sys.stderr`` once :meth:`watch` ran: keeps what is written, and
    sets ``holding`` once a line says the worker holds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.text = ""
        self.holding = threading.Event()

    def watch(self) -> None:
        """From now on (pytest sets its own ``sys.stderr`` after the fixtures ran)."""
        self.monkeypatch.setattr(sys, "stderr", self)

    def write(self, text: str) -> int:
        self.text += text
        if HOLDING in self.text:
            self.holding.set()
        return len(text)

    def flush(self) -> None:
        return None


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    agent = Agent()
    await agent.channel.start()
    yield agent
    await agent.channel.close()


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> Stderr:
    return Stderr(monkeypatch)


@pytest.fixture
async def run(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[WorkerRun]:
    """This process as local rank 0 (rank 3) of generation 2, connected to ``agent``."""
    monkeypatch.setenv("RESURGE_GENERATION", "2")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    run = WorkerRun(agent.channel.path, on_message=agent.on_message)
    run.progress(1, loss=1.0)
    hello, _ = await agent.next_report()
    assert (hello.local_rank, hello.generation) == (0, 2)
    yield run
    run.close()


async def ask(agent: Agent, run: WorkerRun, stderr: Stderr, hold_seconds: float) -> None:
    """A checkpoint request of generation 2, handled by ``run`` when this returns;
    ``stderr`` watched from now on."""
    stderr.watch()
    assert agent.channel.request_checkpoint(2, "node warning", hold_seconds) == [0]
    await agent.next_received()
    assert run.checkpoint_requested()


async def saving(run: WorkerRun, stderr: Stderr) -> asyncio.Task[None]:
    """``checkpoint_saved(5)`` on a thread, once it holds."""
    saved = asyncio.create_task(asyncio.to_thread(run.checkpoint_saved, 5, "/ckpt/step-5"))
    await asyncio.wait_for(asyncio.to_thread(stderr.holding.wait, WAIT), WAIT)
    assert stderr.holding.is_set(), stderr.text
    return saved


async def test_a_held_worker_holds_through_the_stop_notice(
    agent: Agent, run: WorkerRun, stderr: Stderr
) -> None:
    await ask(agent, run, stderr, 60.0)
    saved = await saving(run, stderr)
    assert (await agent.next_report())[1] == CheckpointReport(5, "/ckpt/step-5")
    assert run.holding and not saved.done()
    assert await agent.channel.notify_stop_pending(2, "moved off its node") == 1
    assert isinstance(await agent.next_received(), StopPending)  # handled by now
    assert run.stop_pending and run.holding and not saved.done()
    run.close()  # the end of the process, here: the hold ends with it
    await asyncio.wait_for(saved, WAIT)
    assert "rank 3: holding after the checkpoint of step 5 (node warning)" in stderr.text
    assert "training on" not in stderr.text


async def test_a_restart_ends_the_hold(agent: Agent, run: WorkerRun, stderr: Stderr) -> None:
    await ask(agent, run, stderr, 60.0)
    saved = await saving(run, stderr)
    assert agent.channel.send(0, restart_line(2, {}, []))  # not newer: ignored
    await agent.next_received()
    assert run.holding and not saved.done()
    assert agent.channel.send(0, restart_line(3, {"RESURGE_GENERATION": "3"}, []))
    await asyncio.wait_for(saved, WAIT)
    assert not run.holding
    assert "training on" not in stderr.text


async def test_a_hold_runs_out_and_training_goes_on(
    agent: Agent, run: WorkerRun, stderr: Stderr
) -> None:
    await ask(agent, run, stderr, 0.5)
    saved = await saving(run, stderr)
    await asyncio.wait_for(saved, WAIT)
    assert "no stop or restart within 0.5 s: training on after step 5" in stderr.text
    # It answered that request: the next checkpoint does not hold.
    stderr.holding.clear()
    run.checkpoint_saved(6, "/ckpt/step-6")
    assert stderr.text.count(HOLDING) == 1


async def test_a_request_without_a_hold_does_not_hold(
    agent: Agent, run: WorkerRun, stderr: Stderr
) -> None:
    await ask(agent, run, stderr, 0.0)
    run.checkpoint_saved(5, "/ckpt/step-5")  # returns at once, as before
    assert (await agent.next_report())[1] == CheckpointReport(5, "/ckpt/step-5")
    assert stderr.text == ""


async def test_a_request_for_another_generation_does_not_hold(
    agent: Agent, run: WorkerRun, stderr: Stderr
) -> None:
    stderr.watch()
    assert agent.channel.send(0, checkpoint_now_line(1, "old", 60.0))
    await agent.next_received()
    run.checkpoint_saved(5, "/ckpt/step-5")
    assert stderr.text == ""


@pytest.mark.parametrize("how", ["connect", "restartable"])
async def test_the_stops_sigterm_ends_a_held_worker(agent: Agent, how: str) -> None:
    proc = await start_worker(f"HOW = {how!r}\n{SAVING}", agent.channel.path)
    _, report = await agent.next_report()
    assert isinstance(report, ProgressReport)
    assert agent.channel.request_checkpoint(0, "node warning", 60.0) == [0]
    assert (await agent.next_report())[1] == CheckpointReport(1, "/ckpt/step-1")
    await held(proc)
    await agent.channel.notify_stop_pending(0, "moved off its node")
    proc.send_signal(signal.SIGTERM)
    result = await finish(proc)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert "went on" not in result.stdout


async def test_an_in_process_restart_ends_a_held_worker(agent: Agent) -> None:
    proc = await start_worker(f"HOW = 'restartable'\n{SAVING}", agent.channel.path)
    await agent.next_report()
    assert agent.channel.request_checkpoint(0, "node warning", 60.0) == [0]
    assert (await agent.next_report())[1] == CheckpointReport(1, "/ckpt/step-1")
    await held(proc)
    assert agent.channel.send(0, restart_line(1, {"RESURGE_GENERATION": "1"}, []))
    _, rejoining = await agent.next_report()
    assert rejoining == Rejoining(generation=1, rank=0)
    result = await finish(proc)
    assert (result.returncode, result.stdout) == (0, "entered 1\n"), result.stderr


async def held(proc: asyncio.subprocess.Process) -> None:
    """Until the worker's stderr says it holds."""
    assert proc.stderr is not None
    while True:
        line = await asyncio.wait_for(proc.stderr.readline(), WAIT)
        assert line, "the worker's stderr ended before it held"
        if HOLDING.encode() in line:
            return
