"""``WorkerRun.checkpoint_requested()`` and the opt-in checkpoint signal, against a real
WorkerChannel (the agent's end of the socket)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from resurge.worker import WorkerRun
from resurge.worker.wire import AgentMessage, CheckpointReport, Hello, checkpoint_now_line
from resurge_node_agent.launch.worker_channel import Report, WorkerChannel, socket_path_for
from tests.integration.test_worker_channel import WAIT, run_worker

# Under `connect` or `restartable` (HOW, set before it), with a SIGUSR1 handler: waits
# (bounded) until the handler ran, then says what the run saw.
SIGNALLED = """
import signal, sys, time
from resurge import worker
got = []
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))

def body(run):
    run.progress(1, loss=1.0)
    for _ in range(2000):
        if got:
            print("signal", run.checkpoint_requested(), run.checkpoint_reason, flush=True)
            return 0
        time.sleep(0.01)
    return 3

if HOW == "connect":
    sys.exit(body(worker.connect(checkpoint_signal=signal.SIGUSR1)))
sys.exit(worker.restartable(body, checkpoint_signal=signal.SIGUSR1)())
"""

# Opts in to SIGUSR1 but installs no handler: the library must not end the process.
NO_HANDLER = """
import signal, sys, time
from resurge import worker
run = worker.connect(checkpoint_signal=signal.SIGUSR1)
run.progress(1, loss=1.0)
for _ in range(2000):
    if run.checkpoint_requested():
        print("requested", run.checkpoint_reason, flush=True)
        sys.exit(0)
    time.sleep(0.01)
sys.exit(3)
"""


class Agent:
    """A WorkerChannel whose reports, and the worker's received messages, are queues."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.channel = WorkerChannel(socket_path_for("checkpoints", 0), on_report=self._report)
        self.reports: asyncio.Queue[tuple[Hello, Report]] = asyncio.Queue()
        self.received: asyncio.Queue[AgentMessage] = asyncio.Queue()

    async def _report(self, hello: Hello, report: Report) -> None:
        await self.reports.put((hello, report))

    def on_message(self, message: AgentMessage) -> None:
        """WorkerRun's hook, called in its link thread after it handled ``message``."""
        self.loop.call_soon_threadsafe(self.received.put_nowait, message)

    async def next_report(self) -> tuple[Hello, Report]:
        return await asyncio.wait_for(self.reports.get(), WAIT)

    async def next_received(self) -> AgentMessage:
        return await asyncio.wait_for(self.received.get(), WAIT)


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    agent = Agent()
    await agent.channel.start()
    yield agent
    await agent.channel.close()


@pytest.fixture
async def run(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[WorkerRun]:
    """This process as local rank 1 (rank 5) of generation 2, connected to ``agent``."""
    monkeypatch.setenv("RESURGE_GENERATION", "2")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    run = WorkerRun(agent.channel.path, on_message=agent.on_message)
    run.progress(1, loss=1.0)
    hello, _ = await agent.next_report()  # the channel knows the worker now
    assert (hello.local_rank, hello.generation) == (1, 2)
    yield run
    run.close()


async def test_a_request_is_true_once(agent: Agent, run: WorkerRun) -> None:
    assert run.checkpoint_requested() is False
    assert agent.channel.request_checkpoint(1, "for generation 1") == []
    assert agent.channel.request_checkpoint(3, "for generation 3") == []
    assert agent.channel.request_checkpoint(2, "resize 2 -> 4") == [1]
    await agent.next_received()
    assert run.checkpoint_reason == "resize 2 -> 4"
    assert [run.checkpoint_requested() for _ in range(3)] == [True, False, False]
    # two requests before the loop looks: one checkpoint answers both
    agent.channel.request_checkpoint(2, "first")
    agent.channel.request_checkpoint(2, "second")
    await agent.next_received()
    await agent.next_received()
    assert [run.checkpoint_requested() for _ in range(2)] == [True, False]
    assert run.checkpoint_reason == "second"


async def test_checkpoint_saved_answers_a_request(agent: Agent, run: WorkerRun) -> None:
    agent.channel.request_checkpoint(2, "resize")
    await agent.next_received()
    run.checkpoint_saved(7, "/ckpt/step-7")
    assert run.checkpoint_requested() is False
    _, report = await agent.next_report()
    assert report == CheckpointReport(step=7, path="/ckpt/step-7")


async def test_the_worker_ignores_a_request_for_another_generation(
    agent: Agent, run: WorkerRun
) -> None:
    for generation in (1, 3):  # sent past the channel's own check
        assert agent.channel.send(1, checkpoint_now_line(generation, "not mine"))
        await agent.next_received()
        assert run.checkpoint_requested() is False
    assert run.checkpoint_reason is None


@pytest.mark.parametrize("how", ["connect", "restartable"])
async def test_the_opt_in_signal_reaches_the_scripts_handler(agent: Agent, how: str) -> None:
    code = f"HOW = {how!r}\n{SIGNALLED}"
    worker = asyncio.create_task(run_worker(code, agent.channel.path, generation=4))
    hello, _ = await agent.next_report()
    assert hello.in_process is (how == "restartable")
    assert agent.channel.request_checkpoint(4, "resize 1 -> 2") == [0]
    result = await worker
    assert (result.returncode, result.stdout) == (0, "signal True resize 1 -> 2\n"), result.stderr


async def test_without_a_handler_the_signal_is_not_raised(agent: Agent) -> None:
    worker = asyncio.create_task(run_worker(NO_HANDLER, agent.channel.path, generation=0))
    await agent.next_report()
    assert agent.channel.request_checkpoint(0, "resize") == [0]
    result = await worker
    assert (result.returncode, result.stdout) == (0, "requested resize\n"), result.stderr
    assert "SIGUSR1 has no handler; not raising it" in result.stderr
