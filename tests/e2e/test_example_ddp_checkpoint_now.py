"""The DDP example (examples/ddp/train.py) saves a checkpoint at once when its agent asks.

Two real ranks on gloo/CPU, linked to a real WorkerChannel (the agent's end of the
socket). The request goes to one rank only: the flag travels in the step's all-reduce,
so both ranks save the same step together (``dcp.save`` is collective) and report it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from resurge.worker.wire import CheckpointReport, Hello, ProgressReport, checkpoint_now_line
from resurge_node_agent.launch.worker_channel import Report, WorkerChannel, socket_path_for
from tests.e2e.test_example_ddp import Finished, checkpoints, finish, start

pytestmark = pytest.mark.e2e

WAIT = 60.0


async def test_a_request_to_one_rank_makes_every_rank_save_that_step(tmp_path: Path) -> None:
    reports: asyncio.Queue[tuple[Hello, Report]] = asyncio.Queue()

    async def on_report(hello: Hello, report: Report) -> None:
        await reports.put((hello, report))

    async def next_report(kind: type[Report]) -> tuple[Hello, Report]:
        while True:
            hello, report = await asyncio.wait_for(reports.get(), WAIT)
            if isinstance(report, kind):
                return hello, report

    channel = WorkerChannel(socket_path_for("ddp", 0), on_report=on_report)
    await channel.start()
    ckpt = tmp_path / "ckpt"
    args = ["--steps", "150", "--checkpoint-every", "0", "--step-seconds", "0.02"]
    env = {"RESURGE_AGENT_SOCKET": channel.path, "RESURGE_GENERATION": "0"}
    procs = start(tmp_path, [*args, "--checkpoint-dir", str(ckpt)], env)
    try:
        progressed: set[int] = set()
        while progressed != {0, 1}:  # both ranks connected and training
            hello, _ = await next_report(ProgressReport)
            progressed.add(hello.local_rank)
        assert channel.send(1, checkpoint_now_line(0, "resize 2 -> 4"))
        saved: dict[int, CheckpointReport] = {}
        while len(saved) < 2:
            hello, report = await next_report(CheckpointReport)
            assert isinstance(report, CheckpointReport)
            saved[hello.rank] = report
        codes, outputs = await asyncio.to_thread(finish, procs, tmp_path)
    finally:
        await channel.close()
    assert codes == [0, 0], "\n".join(outputs)
    step = saved[0].step
    assert saved == {r: CheckpointReport(step, str(ckpt / f"step-{step:08d}")) for r in (0, 1)}
    assert 1 <= step < 150
    assert checkpoints(ckpt) == {f"step-{step:08d}": True}  # that one, complete, and no other
    result = Finished(outputs)
    assert f"checkpoint requested: saving at step {step}" in result.rank0
    assert result.value("final") == "step 150"
