"""A job no node of the cluster can hold: ``resurge submit`` accepts it with a warning
naming ``nprocPerNode`` and the largest node, and the scaler keeps it Pending with a
status message that says what it needs and what the cluster has, until nodes that can
hold it come. Real nats-server, the real scaler service, the real ``resurge`` CLI."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from resurge.cluster import ClusterBackend, NodeInfo, open_backend
from resurge.cluster.local.keys import JOB_STATUS_BUCKET
from resurge.control.state.records import JobStore
from resurge.events import CapacityChanged, JobPhase
from resurge.local.job_factory import EXAMPLE
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

JOB = "ddp-example"  # examples/ddp/job.yaml: 2 replicas of nprocPerNode 2


def environment(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
    }


@pytest.fixture
def scaler(settings: Settings, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A scaler process; SIGTERMed after the test, which it must obey within 20 s (if
    not, its log ends with where each of its threads and tasks waits: SIGQUIT)."""
    log = tmp_path / "scaler.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "resurge_scaler"],
            env=environment(settings),
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGQUIT)
        time.sleep(1)  # the dump is written from the process's own loop; nothing to await
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"the scaler ignored SIGTERM for 20 s:\n{log.read_text()[-6000:]}"
        ) from None


class Monitors:
    """The nodes' monitors: each added node reported, and again every second, as a
    monitor's heartbeat does (a node reported once goes silent after the backend's
    NODE_TIMEOUT_SECONDS: on loaded cores this test outlived it, and the scaler's status
    called every node 'not reporting')."""

    def __init__(self, bus: Bus, backend: ClusterBackend) -> None:
        self.bus, self.backend = bus, backend
        self.nodes: dict[str, int] = {}
        self.task = asyncio.get_running_loop().create_task(self._beat())

    async def add(self, name: str, slots: int) -> None:
        """Report a node as its monitor does, and say its capacity changed."""
        self.nodes[name] = slots
        await self.backend.report_node(NodeInfo(name=name, slots=slots))
        event = CapacityChanged(
            source=self.bus.source, node=name, slots_total=slots, slots_free=slots, healthy=True
        )
        await self.bus.publish(self.bus.subjects.capacity(name), event)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(1.0)  # a heartbeat's period, not a wait for anything
            for name, slots in list(self.nodes.items()):
                await self.backend.report_node(NodeInfo(name=name, slots=slots))

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def status_when(
    bus: Bus, backend: ClusterBackend, log: Path, test: Callable[[dict[str, object]], bool]
) -> dict[str, object]:
    """The job's written status once ``test`` holds for it (read again at each write)."""
    writes: asyncio.Queue[None] = asyncio.Queue()

    async def wrote(_msg: Msg) -> None:
        writes.put_nowait(None)

    bucket = bus.subjects.kv_bucket(JOB_STATUS_BUCKET)
    subscription = await bus.nc.subscribe(f"$KV.{bucket}.>", cb=wrote)
    status = None
    try:
        async with asyncio.timeout(30):
            while True:
                status = await backend.read_job_status(JOB)
                if status is not None and test(status):
                    return status
                await writes.get()
    except TimeoutError:  # seen twice in CI with a silent scaler: say what each side held
        found = await JobStore(await bus.jobs_bucket()).get(JOB)
        record = found[0].model_dump_json(exclude={"spec"}) if found else None
        raise AssertionError(
            f"no such status in 30 s; last status {status}; record {record}; "
            f"the scaler's log:\n{(await asyncio.to_thread(log.read_text))[-6000:]}"
        ) from None
    finally:
        await subscription.unsubscribe()


async def test_a_job_no_node_can_hold_is_accepted_with_a_warning_and_says_why_it_waits(
    bus: Bus, settings: Settings, scaler: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    log = tmp_path / "scaler.log"
    backend = await open_backend(bus, settings)
    monitors = Monitors(bus, backend)
    try:
        await held_pending_then_running(bus, settings, backend, monitors, log)
    finally:
        await monitors.stop()


async def held_pending_then_running(
    bus: Bus, settings: Settings, backend: ClusterBackend, monitors: Monitors, log: Path
) -> None:
    await monitors.add("n0", 1)
    await monitors.add("n1", 1)

    submitted = await asyncio.to_thread(
        subprocess.run,
        [str(Path(sys.executable).parent / "resurge"), "submit", str(EXAMPLE)],
        env=environment(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == f"trainingjob {JOB} submitted"
    assert submitted.stderr.strip() == (
        f"resurge submit: warning: {JOB} stays Pending: no node of this cluster can hold it: "
        "no node has 2 free-able slots for nprocPerNode 2 (largest node: 1 GPU); add a node "
        "with `resurge node add --gpus 2`"
    )

    never = "no node of this cluster can hold it: no node has 2 free-able slots"
    pending = await status_when(bus, backend, log, lambda s: str(s["message"]).startswith(never))
    assert pending["phase"] == "Pending"
    assert pending["message"] == (
        f"{never} for nprocPerNode 2 (largest node: 1 GPU); add a node with "
        "`resurge node add --gpus 2`"
    )

    await monitors.add("n2", 2)
    fewer = await status_when(bus, backend, log, lambda s: "hold at most 1" in str(s["message"]))
    assert fewer["phase"] == "Pending"
    assert fewer["message"] == (
        "no node of this cluster can hold it: it needs 2 replica(s) of nprocPerNode 2 slots, "
        "and its 3 node(s) hold at most 1 (largest node: 2 GPUs); add 1 node(s) with "
        "`resurge node add --gpus 2`"
    )

    await monitors.add("n3", 2)
    running = await status_when(bus, backend, log, lambda s: s["phase"] == JobPhase.RUNNING.value)
    found = await JobStore(await bus.jobs_bucket()).get(JOB)
    assert found is not None
    assert sorted(p.node for p in found[0].placements) == ["n2", "n3"]
    assert running["replicas"] == {"current": 2, "target": 2}
