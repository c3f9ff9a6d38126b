"""GPU monitoring: NVML readings and errors, simulated GPUs, and a real monitor process that
reports its GPUs and takes an XID injected with `resurge inject xid`.

This machine has no NVIDIA GPU (no driver, no libnvidia-ml), so NvmlGpus is tested
against FakePynvml below: a FAKE `pynvml` module object, injected into the constructor,
that answers like NVML would for a few made-up GPUs.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from resurge.events import Event, GpuError, GpuSample, NodeReport
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings
from resurge_node_agent.monitor.gpus import (
    SIMULATE_GPUS,
    GpuErrorReport,
    NvmlGpus,
    SimulatedGpus,
    monitoring,
    select_gpus,
)
from tests.collect import Events
from tests.monitor_process import cli_env, running_monitor

BIN = Path(sys.executable).parent
LOGGER = "resurge.node-monitor.gpus"


class FakeNvmlError(Exception):
    """Like pynvml.NVMLError: carries NVML's return code as ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakePynvml:
    """A FAKE pynvml (no GPU exists here): ``count`` GPUs, scripted faults and events."""

    NVMLError = FakeNvmlError
    NOT_SUPPORTED, TIMEOUT, GPU_IS_LOST, LIBRARY_NOT_FOUND = 3, 10, 15, 12

    def __init__(self, count: int = 2, *, init_fails: bool = False) -> None:
        self.count = count
        self.init_fails = init_fails
        self.handles = [object() for _ in range(count)]
        self.ecc = [0] * count
        self.corrected = [0] * count
        self.throttle = [0] * count
        self.no_corrected: set[int] = set()
        self.lost: set[int] = set()
        self.no_power: set[int] = set()
        self.no_remapped_rows: set[int] = set()
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: list[tuple[int, int]] = []
        self.shutdowns = 0
        self.freed = False

    def _index(self, handle: Any) -> int:
        index = self.handles.index(handle)
        if index in self.lost:
            raise FakeNvmlError(self.GPU_IS_LOST)
        return index

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise FakeNvmlError(self.LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self.handles[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        return f"GPU-fake-{self.handles.index(handle)}".encode()  # older pynvml: bytes

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=40 + self._index(handle), memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        index = self._index(handle)
        return SimpleNamespace(total=80 * 2**30, used=(index + 1) * 2**30, free=0)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        assert sensor == 0  # NVML_TEMPERATURE_GPU
        return 50 + self._index(handle)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        if self._index(handle) in self.no_power:
            raise FakeNvmlError(self.NOT_SUPPORTED)
        return 250_500  # milliwatts

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        assert error_type in (0, 1) and counter == 0  # corrected or uncorrected, volatile
        index = self._index(handle)
        if error_type == 0 and index in self.no_corrected:
            raise FakeNvmlError(self.NOT_SUPPORTED)
        return (self.corrected if error_type == 0 else self.ecc)[index]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self.throttle[self._index(handle)]

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        if self._index(handle) in self.no_remapped_rows:
            raise FakeNvmlError(self.NOT_SUPPORTED)
        return (2, 1, 0, 0)

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        self._index(handle)
        return [0x1000] if cause == 1 else []

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: str) -> None:
        self.registered.append((self.handles.index(handle), types))

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> Any:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise FakeNvmlError(self.TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = True

    def raise_xid(self, gpu: int, xid: int) -> None:
        self.events.put(SimpleNamespace(device=self.handles[gpu], eventType=0x8, eventData=xid))


class OlderPynvml(FakePynvml):
    """A pynvml without the throttle reasons call."""

    nvmlDeviceGetCurrentClocksThrottleReasons = None  # type: ignore[assignment]


class Reports:
    """An error sink that any thread may call; the test waits on it with a timeout."""

    def __init__(self) -> None:
        self.queue: queue.Queue[GpuErrorReport] = queue.Queue()

    def __call__(self, report: GpuErrorReport) -> None:
        self.queue.put(report)

    def next(self) -> GpuErrorReport:
        return self.queue.get(timeout=10)

    def none_left(self) -> bool:
        return self.queue.empty()


# NvmlGpus against the fake


def test_nvml_readings_are_assembled_from_each_query() -> None:
    fake = FakePynvml(2)
    fake.no_power.add(1)
    fake.no_remapped_rows.add(1)
    gpus = NvmlGpus(fake)
    assert gpus.count == 2 and gpus.uuids == ["GPU-fake-0", "GPU-fake-1"]
    first, second = gpus.readings()
    assert first.index == 0 and first.uuid == "GPU-fake-0" and first.healthy
    assert first.utilization_percent == 40.0
    assert first.memory_used_bytes == 2**30 and first.memory_total_bytes == 80 * 2**30
    assert first.temperature_c == 50.0 and first.power_watts == 250.5
    assert first.ecc_uncorrected == 0 and first.retired_pages == 3  # remapped rows
    assert second.power_watts is None  # not supported: no value, no error
    assert second.retired_pages == 1  # no row remapping: retired pages instead
    gpus.close()
    assert fake.shutdowns == 1


def test_nvml_reads_corrected_ecc_and_the_throttle_reasons_by_name() -> None:
    fake = FakePynvml(2)
    fake.corrected[0] = 17
    fake.throttle[0] = 0x20 | 0x40 | 0x4  # sw thermal, hw thermal, sw power cap
    fake.no_corrected.add(1)
    gpus = NvmlGpus(fake)
    first, second = gpus.readings()
    assert first.ecc_corrected == 17
    assert first.throttle_reasons == ["sw_power_cap", "sw_thermal", "hw_thermal"]
    assert second.ecc_corrected is None  # not supported: no value, no error
    assert second.throttle_reasons == []  # NVML says: not throttled
    fake.corrected[0] = 40
    fake.throttle[0] = 0x80
    first = gpus.readings()[0]
    assert first.ecc_corrected == 40 and first.throttle_reasons == ["hw_power_brake"]
    gpus.close()


def test_nvml_without_the_throttle_reasons_call_reads_none() -> None:
    gpus = NvmlGpus(OlderPynvml(1))
    reading = gpus.readings()[0]
    assert reading.throttle_reasons is None and reading.ecc_corrected == 0
    gpus.close()


def test_nvml_xid_event_becomes_an_error_and_a_fatal_one_an_unhealthy_gpu() -> None:
    fake = FakePynvml(2)
    gpus = NvmlGpus(fake, event_wait_ms=50)
    reports = Reports()
    gpus.start(reports)
    try:
        assert fake.registered == [(0, 0x8), (1, 0x8)]  # XID critical errors, every GPU
        fake.raise_xid(0, 13)
        app = reports.next()
        assert (app.gpu, app.error, app.xid, app.uuid) == (0, "xid", 13, "GPU-fake-0")
        assert "Graphics engine exception" in app.message
        assert gpus.unhealthy() == []  # an application's error: the GPU is fine
        fake.raise_xid(1, 79)
        bus_error = reports.next()
        assert (bus_error.gpu, bus_error.xid) == (1, 79)
        assert gpus.unhealthy() == [1]
        assert [r.healthy for r in gpus.readings()] == [True, False]
    finally:
        gpus.close()
    assert fake.freed and fake.shutdowns == 1


def test_nvml_lost_gpu_fell_off_the_bus_once() -> None:
    fake = FakePynvml(2)
    gpus = NvmlGpus(fake)
    reports = Reports()
    gpus.start(reports)
    try:
        fake.lost.add(1)
        readings = gpus.readings()
        lost = reports.next()
        assert (lost.gpu, lost.error, lost.xid) == (1, "fell_off_bus", None)
        assert "fell off the bus" in lost.message
        assert readings[0].healthy and readings[0].temperature_c == 50.0
        assert not readings[1].healthy and readings[1].temperature_c is None
        assert gpus.unhealthy() == [1]
        gpus.readings()
        assert reports.none_left()  # reported once, not on every reading
    finally:
        gpus.close()


def test_nvml_rise_in_uncorrected_ecc_errors_is_reported() -> None:
    fake = FakePynvml(1)
    gpus = NvmlGpus(fake)
    reports = Reports()
    gpus.start(reports)
    try:
        gpus.readings()  # the baseline
        fake.ecc[0] = 2
        assert gpus.readings()[0].ecc_uncorrected == 2
        ecc = reports.next()
        assert (ecc.gpu, ecc.error) == (0, "ecc") and "from 0 to 2" in ecc.message
        assert gpus.unhealthy() == []  # the XID that comes with it decides
    finally:
        gpus.close()


def test_without_nvml_no_gpus_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    gpus = NvmlGpus(FakePynvml(init_fails=True))
    reports = Reports()
    gpus.start(reports)
    assert gpus.count == 0
    assert gpus.readings() == [] and gpus.readings() == [] and gpus.unhealthy() == []
    gpus.close()
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and "NVML is not available" in lines[0], lines


def test_select_gpus_simulates_only_where_nvml_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SIMULATE_GPUS, raising=False)
    simulated = select_gpus(2, "n1", nvml=FakePynvml(init_fails=True))
    assert isinstance(simulated, SimulatedGpus) and simulated.count == 2
    assert isinstance(select_gpus(0, "n1", nvml=FakePynvml(init_fails=True)), NvmlGpus)
    real = select_gpus(4, "n1", nvml=FakePynvml(1))
    assert isinstance(real, NvmlGpus) and real.count == 1
    real.close()
    monkeypatch.setenv(SIMULATE_GPUS, "1")
    assert isinstance(select_gpus(2, "n1", nvml=FakePynvml(1)), SimulatedGpus)


def test_a_monitor_says_how_it_watches_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the fake pynvml: NVML's GPUs, simulated ones (asked for with --gpus), or none
    (no NVML and no --gpus, the DaemonSet's default: nothing simulated)."""
    monkeypatch.delenv(SIMULATE_GPUS, raising=False)
    real = select_gpus(0, "n1", nvml=FakePynvml(2))
    assert monitoring(real) == "nvml"
    real.close()
    assert monitoring(select_gpus(2, "n1", nvml=FakePynvml(init_fails=True))) == "simulated"
    assert monitoring(select_gpus(0, "n1", nvml=FakePynvml(init_fails=True))) == "none"


# SimulatedGpus


def test_simulated_gpus_read_plausibly_and_take_injected_xids() -> None:
    gpus = SimulatedGpus(2, seed="n1")
    assert SimulatedGpus(2, seed="n1").uuids == gpus.uuids  # stable per node
    reports = Reports()
    gpus.start(reports)
    for reading in gpus.readings():
        assert reading.uuid.startswith("sim-") and reading.healthy
        assert 0 <= (reading.utilization_percent or 0) <= 100
        assert 0 < (reading.memory_used_bytes or 0) <= (reading.memory_total_bytes or 0)
        assert 20 < (reading.temperature_c or 0) < 90 and (reading.power_watts or 0) > 0
    gpus.inject_xid(0, 31)
    assert reports.next().xid == 31 and gpus.unhealthy() == []
    returned = gpus.inject_xid(1, 48)
    assert reports.next() == returned and returned.error == "xid"
    assert gpus.unhealthy() == [1]
    second = gpus.readings()[1]
    assert not second.healthy and second.ecc_uncorrected == 1
    with pytest.raises(IndexError, match="no GPU 2: this node has 2"):
        gpus.inject_xid(2, 79)
    assert gpus.repair() == [1] and gpus.unhealthy() == []  # the node was repaired
    healed = gpus.readings()[1]
    assert healed.healthy and healed.ecc_uncorrected == 1  # its counters are kept


# A real monitor process and the real `resurge inject xid`


async def resurge(settings: Settings, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        str(BIN / "resurge"),
        *args,
        env=cli_env(settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture
async def node_events(bus: Bus) -> AsyncIterator[Events]:
    events = Events()
    sub = await bus.subscribe(bus.subjects.raw("_", None, "n1"), events.add)
    await bus.nc.flush()
    yield events
    await sub.unsubscribe()


@pytest.fixture
async def monitor(settings: Settings, tmp_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    async with running_monitor(settings, tmp_path, stop_seconds=20) as process:
        yield process


def reports_of(items: list[Event]) -> list[NodeReport]:
    return [e for e in items if isinstance(e, NodeReport)]


async def test_monitor_reports_simulated_gpus_and_takes_an_injected_xid(
    settings: Settings, node_events: Events, monitor: asyncio.subprocess.Process
) -> None:
    # The monitor binds its command consumer before its first report: once a report is
    # seen, an injected XID is heard.
    first = await node_events.wait_for(lambda items: reports_of(items)[:1])
    [report] = first
    assert report.node == "n1" and report.slots_total == 2 and report.slots_free == 2
    assert report.healthy and report.unhealthy_gpus == []
    sample = await node_events.wait_for(
        lambda items: next((e for e in items if isinstance(e, GpuSample)), None)
    )
    assert sample.simulated and [g.index for g in sample.gpus] == [0, 1]
    assert all(g.healthy and g.uuid.startswith("sim-") for g in sample.gpus)

    code, out, err = await resurge(
        settings, "inject", "xid", "--node", "n1", "--gpu", "1", "--code", "79"
    )
    assert code == 0, err
    assert "injected XID 79 into GPU 1 of node n1" in out and "replace_node" in out

    def gpu_error(items: list[Event]) -> int | None:
        return next((i for i, e in enumerate(items) if isinstance(e, GpuError)), None)

    at = await node_events.wait_for(gpu_error)
    error = node_events.items[at]
    assert isinstance(error, GpuError)
    assert (error.node, error.gpu, error.error, error.xid) == ("n1", 1, "xid", 79)
    assert error.uuid == sample.gpus[1].uuid and "fallen off the bus" in error.message
    after = await node_events.wait_for(lambda items: reports_of(items[at + 1 :])[:1])
    assert after[0].unhealthy_gpus == [1] and not after[0].healthy

    # Uncordon: the operator's word that the node was repaired; the GPU is healthy again.
    seen = len(node_events.items)
    code, out, err = await resurge(settings, "node", "uncordon", "n1")
    assert code == 0, err
    repaired = await node_events.wait_for(
        lambda items: [r for r in reports_of(items[seen:]) if r.healthy][:1]
    )
    assert repaired[0].unhealthy_gpus == []


async def test_inject_xid_refuses_unknown_nodes_and_gpus(
    settings: Settings, node_events: Events, monitor: asyncio.subprocess.Process
) -> None:
    await node_events.wait_for(lambda items: reports_of(items)[:1])  # n1 has its record
    code, _, err = await resurge(
        settings, "inject", "xid", "--node", "n9", "--gpu", "0", "--code", "79"
    )
    assert code == 1 and "no node named 'n9' (nodes: n1)" in err
    code, _, err = await resurge(
        settings, "inject", "xid", "--node", "n1", "--gpu", "2", "--code", "79"
    )
    assert code == 1 and "node 'n1' has 2 GPUs; there is no GPU 2" in err


async def test_inject_names_the_missing_options(settings: Settings) -> None:
    code, _, err = await resurge(settings, "inject", "xid", "--node", "n1")
    assert code == 2 and "inject xid needs --node --gpu --code; missing --gpu, --code" in err
    code, _, err = await resurge(settings, "inject", "crash", "--job", "j")
    assert code == 2 and "inject crash needs --job --rank; missing --rank" in err
    code, _, err = await resurge(
        settings, "inject", "hang", "--job", "j", "--rank", "0", "--gpu", "1"
    )
    assert code == 2 and "inject hang does not take --gpu" in err
    code, _, err = await resurge(
        settings, "inject", "xid", "--node", "n1", "--gpu", "-1", "--code", "79"
    )
    assert code == 2 and "-1 is below 0" in err
