"""GPU resets and node health checks: NvmlGpus against a FAKE pynvml (no GPU exists here)
with a real reset command (a Python process standing in for ``nvidia-smi --gpu-reset``
and for a health check command), simulated GPUs, and a real monitor process that
answers the restarter's ResetGpu on a real nats-server."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from resurge.contract.subjects import NODE_LEVEL_JOB
from resurge.contract.subscriptions import RESTARTER_GPU_RESETS, Scope
from resurge.events import (
    CheckNode,
    Event,
    GpuError,
    GpuReset,
    InjectGpuError,
    NodeChecked,
    NodeReport,
    ResetGpu,
    Source,
)
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from resurge_node_agent.monitor.gpus import NvmlGpus, SimulatedGpus
from resurge_node_agent.monitor.health_check import check_node
from tests.collect import Events
from tests.integration.test_gpus import FakePynvml, Reports, node_events, reports_of
from tests.monitor_process import running_monitor

__all__ = ["node_events"]  # the fixture, used here

CLI = Source(service="restarter", instance="test:1")


def command(exit_code: int) -> str:
    """A reset command that prints the GPU index it was given and exits ``exit_code``."""
    script = f"import sys; print('reset', sys.argv[1], file=sys.stderr); sys.exit({exit_code})"
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} {{index}}"


class BusyPynvml(FakePynvml):
    """The FAKE pynvml, with each GPU's compute processes: ``busy[i]`` lists are answered
    one per call (the last one repeats), as processes exit between two polls."""

    def __init__(self, busy: dict[int, list[list[int]]]) -> None:
        super().__init__(2)
        self.busy = busy
        self.polls = 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self.polls += 1
        answers = self.busy.get(self._index(handle), [[]])
        return list(answers.pop(0) if len(answers) > 1 else answers[0])


def xid48(nvml: BusyPynvml, gpus: NvmlGpus, gpu: int = 1) -> None:
    reports = Reports()
    gpus.start(reports)
    nvml.raise_xid(gpu, 48)
    assert reports.next().xid == 48 and gpus.unhealthy() == [gpu]
    assert gpus.resettable() == [gpu]


def test_nvml_reset_waits_for_the_gpus_processes_then_runs_the_command() -> None:
    nvml = BusyPynvml({1: [[4711], []]})
    gpus = NvmlGpus(nvml, event_wait_ms=50)
    try:
        assert gpus.reset(1, command(0), 10).reset is False  # healthy: nothing to do
        xid48(nvml, gpus)
        outcome = gpus.reset(1, command(0), 10)
        assert outcome.ok and outcome.reset and "-c" in outcome.message
        assert nvml.polls == 2  # busy once, then idle
        assert gpus.unhealthy() == [] and gpus.resettable() == []
        assert nvml.registered[-1] == (1, 0x8)  # its XID events are watched again
    finally:
        gpus.close()


def test_nvml_reset_fails_with_the_commands_words_or_a_gpu_still_in_use() -> None:
    nvml = BusyPynvml({1: [[4711]]})
    gpus = NvmlGpus(nvml, event_wait_ms=50)
    try:
        xid48(nvml, gpus)
        busy = gpus.reset(1, command(0), 0.6)
        assert not busy.ok and "1 process(es) still use it after 0.6 s" in busy.message
        nvml.busy[1] = [[]]
        failed = gpus.reset(1, command(3), 10)
        assert not failed.ok and "exited 3: reset 1" in failed.message
        assert gpus.unhealthy() == [1]  # still out of use
    finally:
        gpus.close()


def test_a_gpu_off_the_bus_is_out_for_good_not_resettable() -> None:
    gpus = SimulatedGpus(2, seed="n1")
    gpus.inject_xid(0, 48)
    gpus.inject_xid(1, 79)
    assert gpus.unhealthy() == [0, 1] and gpus.resettable() == [0]
    gpus.inject_xid(0, 79)  # the reset-worthy GPU then fell off the bus too
    assert gpus.resettable() == []


def test_simulated_reset_heals_unless_its_resets_were_broken() -> None:
    gpus = SimulatedGpus(2, seed="n1")
    gpus.inject_xid(1, 48)
    gpus.break_resets(1)
    assert not gpus.reset(1, "unused", 1).ok and gpus.unhealthy() == [1]
    gpus.repair()
    gpus.inject_xid(1, 48)
    outcome = gpus.reset(1, "unused", 1)
    assert outcome.ok and outcome.reset and gpus.unhealthy() == []


async def test_a_monitor_resets_the_gpu_it_is_asked_to_and_reports_the_node_healthy(
    settings: Settings, bus: Bus, node_events: Events, tmp_path: Path
) -> None:
    async with running_monitor(settings, tmp_path, stop_seconds=20):
        await node_events.wait_for(lambda items: reports_of(items)[:1])
        node_cmd = bus.subjects.node_cmd("n1")
        await bus.publish(node_cmd, InjectGpuError(source=CLI, node="n1", gpu=1, xid=48))

        def after_error(items: list[Event]) -> list[NodeReport]:
            at = next((i for i, e in enumerate(items) if isinstance(e, GpuError)), None)
            return [] if at is None else [r for r in reports_of(items[at:]) if not r.healthy]

        [down] = (await node_events.wait_for(after_error))[:1]
        assert down.unhealthy_gpus == [1] and down.resettable_gpus == [1]

        ask = ResetGpu(source=CLI, node="n1", job="j", generation=4, gpus=[1], reason="XID 48")
        await bus.publish(node_cmd, ask)
        answers = await node_events.wait_for(
            lambda items: [e for e in items if isinstance(e, GpuReset)]
        )
        assert [(a.request, a.gpu, a.ok, a.reset) for a in answers] == [(ask.id, 1, True, True)]
        assert answers[0].node == "n1" and answers[0].uuid.startswith("sim-")
        seen = node_events.items.index(answers[0])
        up = await node_events.wait_for(
            lambda items: [r for r in reports_of(items[seen:]) if r.healthy][:1]
        )
        assert up[0].unhealthy_gpus == [] and up[0].resettable_gpus == []

        # Asked again (a second job's recovery on the same GPU): nothing left to reset.
        again = ask.model_copy(update={"id": "second-ask", "job": "k"})
        await bus.publish(node_cmd, again)
        second = await node_events.wait_for(
            lambda items: [
                e for e in items if isinstance(e, GpuReset) and e.request == "second-ask"
            ]
        )
        assert second[0].ok and not second[0].reset


def test_answers_go_on_the_nodes_raw_subject_the_restarter_watches(settings: Settings) -> None:
    subject = RESTARTER_GPU_RESETS.subject(settings.subjects, Scope(node="n1"))
    assert subject == settings.subjects.raw(NODE_LEVEL_JOB, "gpu_reset", "n1")


# The health check of a quarantined node (the monitor's side)


async def checked(gpus: SimulatedGpus, check_command: str = "") -> NodeChecked:
    ask = CheckNode(source=CLI, node="n1", reason="quarantined")
    answer = await check_node(
        ask, gpus, source=CLI, node="n1", reset_command="unused", reset_bound=1,
        check_command=check_command, check_bound=30,
    )  # fmt: skip
    assert answer.request == ask.id and answer.node == "n1"
    return answer


async def test_a_check_resets_what_awaits_a_reset_and_runs_the_check_command() -> None:
    gpus = SimulatedGpus(2, seed="n1")
    gpus.inject_xid(1, 48)
    answer = await checked(gpus, command(0))
    assert answer.passed and answer.reset_gpus == [1] and gpus.unhealthy() == []
    assert "simulated GPU 1 reset; all 2 GPUs answer and are in use" in answer.message
    assert "passed" in answer.message


async def test_a_check_fails_for_a_gpu_out_for_good_or_a_failing_command() -> None:
    gpus = SimulatedGpus(2, seed="n1")
    gpus.inject_xid(0, 79)
    out = await checked(gpus, command(0))
    assert not out.passed and "GPU(s) 0 still out of use" in out.message
    assert "passed" not in out.message  # the command does not run on a broken node
    gpus.repair()
    failing = await checked(gpus, command(2))
    assert not failing.passed and "exited 2: reset" in failing.message
    missing = await checked(gpus, "/nonexistent/dcgmi diag -r 2")
    assert not missing.passed and "could not run" in missing.message
