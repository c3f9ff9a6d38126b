"""Where a node monitor's GPU readings and GPU errors come from.

A :class:`GpuSource` gives one :class:`~resurge.events.GpuReading` per GPU on demand
(:meth:`~GpuSource.readings`, called from a worker thread) and pushes every GPU error, as
it happens, to the callback given to :meth:`~GpuSource.start` (from any thread). A GPU
whose error takes it out of use (an XID whose built-in action is ``reset_gpu`` or
``replace_node``, or a GPU that fell off the bus) stays in :meth:`~GpuSource.unhealthy`
until it is reset (:meth:`GpuSource.reset`, the restarter's ResetGpu), until the
monitor restarts, or, simulated, until :meth:`SimulatedGpus.repair` (the operator's
``resurge node uncordon``).

- :class:`NvmlGpus` reads real GPUs through NVML (``pynvml``): utilisation, memory,
  temperature, power, volatile uncorrected ECC errors (a rise is an ``ecc`` error) and
  corrected ones, remapped rows or retired pages, the clocks' current throttle reasons
  (by name, :data:`THROTTLE_REASONS`), XID events from an NVML event set waited on in a
  thread, and a GPU that answers a query with ``NVML_ERROR_GPU_IS_LOST`` (an error
  ``fell_off_bus``). A reading NVML does not support (or a function this pynvml lacks)
  is null. Where NVML cannot start it logs that once and reports no GPUs. A reset waits
  until no compute process uses the GPU, runs the reset command (``nvidia-smi
  --gpu-reset -i {index}`` by default) and reads the GPU again.
- :class:`SimulatedGpus` makes up plausible readings for a local virtual node;
  :meth:`SimulatedGpus.inject_xid` raises an XID through the same callback, and
  :meth:`SimulatedGpus.inject_warning` makes a GPU's readings show a warning sign from
  then on (the corrected ECC count rising every sample, retired pages growing every
  sample, or thermal throttling), until :meth:`SimulatedGpus.repair`. A simulated reset
  makes the GPU healthy at once, unless :meth:`SimulatedGpus.break_resets` said it
  fails.

:func:`select_gpus` picks one for a monitor started with ``--gpus M``; :func:`monitoring`
says which it is, as the node's report carries it.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from resurge.contract.xid import XidAction, lookup
from resurge.events import GpuReading
from resurge.runtime.logs import RateLimitedLog
from resurge_node_agent.monitor.node_commands import run_command

__all__ = [
    "SIMULATE_GPUS",
    "THROTTLE_REASONS",
    "ErrorSink",
    "GpuErrorReport",
    "GpuSource",
    "NvmlGpus",
    "ResetOutcome",
    "SimulatedGpus",
    "WarningSign",
    "monitoring",
    "select_gpus",
]

# Set to 1 to simulate GPUs even where NVML finds real ones (tests and demos on a GPU
# machine, where injected XIDs must reach a simulated GPU).
SIMULATE_GPUS = "RESURGE_SIMULATE_GPUS"

log = logging.getLogger("resurge.node-monitor.gpus")

# NVML's ABI values (nvml.h); fixed, so a fake pynvml in tests need not define them.
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_TIMEOUT = 10
_NVML_ERROR_GPU_IS_LOST = 15
_NVML_TEMPERATURE_GPU = 0
_NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
_NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_NVML_VOLATILE_ECC = 0
_NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
_NVML_RETIREMENT_CAUSES = (0, 1)  # multiple single-bit ECC errors, double-bit ECC error
_EVENT_WAIT_MS = 1000

# nvmlClocksThrottleReason* bits (nvml.h) by the names readings carry.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock_setting",
}
# Newer pynvml names the call "clocks event reasons"; older ones "throttle reasons".
_THROTTLE_CALLS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)

WarningSign = Literal["corrected-ecc", "retired-pages", "thermal"]


@dataclass(frozen=True)
class GpuErrorReport:
    """One GPU error as a source reports it (the monitor turns it into a GpuError)."""

    gpu: int
    uuid: str
    error: Literal["xid", "fell_off_bus", "ecc", "reset_failed"]
    message: str
    xid: int | None = None


ErrorSink = Callable[[GpuErrorReport], None]


@dataclass(frozen=True)
class ResetOutcome:
    """How a reset of one GPU went: ``ok`` the GPU is healthy and usable again,
    ``reset`` whether it was reset (False: it needed none, or it could not be), and in
    words what was done or what went wrong."""

    ok: bool
    reset: bool
    message: str


class GpuSource(Protocol):
    """One node's GPUs: their readings, their error reports and which are out of use."""

    simulated: bool

    @property
    def count(self) -> int:
        """How many GPUs the node has."""

    @property
    def uuids(self) -> list[str]:
        """Each GPU's UUID, in index order."""

    def start(self, on_error: ErrorSink) -> None:
        """Begin reporting errors to ``on_error`` (called from any thread)."""

    def readings(self) -> list[GpuReading]:
        """One reading per GPU, in index order (may block briefly: call it in a thread)."""

    def unhealthy(self) -> list[int]:
        """Indices of the GPUs taken out of use, ascending."""

    def resettable(self) -> list[int]:
        """Of those, the ones a reset may bring back (their XID asks for ``reset_gpu``)."""

    def reset(self, gpu: int, command: str, timeout: float) -> ResetOutcome:
        """Reset GPU ``gpu`` if it is out of use (blocks: call it in a thread):
        ``command`` resets a real GPU, each wait bounded by ``timeout`` seconds."""

    def close(self) -> None:
        """Stop reporting and release the GPUs' library."""


def _takes_gpu_out(report: GpuErrorReport) -> bool:
    if report.error in ("fell_off_bus", "reset_failed"):
        return True
    return (
        report.error == "xid" and report.xid is not None and lookup(report.xid).action.takes_gpu_out
    )


def _asks_for_reset(report: GpuErrorReport) -> bool:
    return (
        report.error == "xid"
        and report.xid is not None
        and lookup(report.xid).action is XidAction.RESET_GPU
    )


def _xid_message(xid: int) -> str:
    entry = lookup(xid)
    return f"XID {xid}: {entry.description}"


class _Health:
    """Unhealthy GPUs and the error callback, shared by the sources (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unhealthy: set[int] = set()
        self._resettable: set[int] = set()  # of the unhealthy, those a reset may bring back
        self._sink: ErrorSink | None = None

    def start(self, on_error: ErrorSink) -> None:
        self._sink = on_error

    def unhealthy(self) -> list[int]:
        with self._lock:
            return sorted(self._unhealthy)

    def resettable(self) -> list[int]:
        with self._lock:
            return sorted(self._resettable)

    def is_unhealthy(self, gpu: int) -> bool:
        with self._lock:
            return gpu in self._unhealthy

    def heal(self, gpu: int) -> None:
        """GPU ``gpu`` healthy again (it was reset)."""
        with self._lock:
            self._unhealthy.discard(gpu)
            self._resettable.discard(gpu)

    def clear(self) -> list[int]:
        """Every GPU healthy again; the ones that were not."""
        with self._lock:
            was, self._unhealthy = sorted(self._unhealthy), set()
            self._resettable = set()
        return was

    def report(self, report: GpuErrorReport) -> None:
        if _takes_gpu_out(report):
            with self._lock:
                fresh = report.gpu not in self._unhealthy
                self._unhealthy.add(report.gpu)
                if _asks_for_reset(report) and (fresh or report.gpu in self._resettable):
                    self._resettable.add(report.gpu)
                else:  # out for good: off the bus, a failed reset, a replace_node XID
                    self._resettable.discard(report.gpu)
        sink = self._sink
        if sink is None:
            log.warning("GPU %d error before monitoring started: %s", report.gpu, report.message)
            return
        sink(report)


class _GpuLost(Exception):
    pass


class NvmlGpus:
    """Real GPUs through NVML. ``nvml`` is the ``pynvml`` module (a fake one in tests)."""

    simulated = False

    def __init__(self, nvml: Any | None = None, *, event_wait_ms: int = _EVENT_WAIT_MS) -> None:
        self._health = _Health()
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._event_wait_ms = event_wait_ms
        self._event_set: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._lost: set[int] = set()
        self._ecc_seen: dict[int, int] = {}
        self._failures = RateLimitedLog(log, interval=300.0)
        self._nvml: Any = None
        try:
            module = nvml if nvml is not None else importlib.import_module("pynvml")
            module.nvmlInit()
        except Exception as error:  # ImportError, NVMLError_LibraryNotFound, driver errors
            log.info("NVML is not available (%s): no NVIDIA GPUs to report", error)
            return
        self._nvml = module
        try:
            for index in range(module.nvmlDeviceGetCount()):
                handle = module.nvmlDeviceGetHandleByIndex(index)
                self._handles.append(handle)
                self._uuids.append(_text(module.nvmlDeviceGetUUID(handle)))
        except Exception as error:
            log.warning("NVML could not list the GPUs (%s): no NVIDIA GPUs to report", error)
            self._handles, self._uuids = [], []
            self._shutdown_nvml()

    @property
    def count(self) -> int:
        """How many GPUs NVML listed."""
        return len(self._handles)

    @property
    def uuids(self) -> list[str]:
        """Each GPU's UUID, in index order."""
        return list(self._uuids)

    def unhealthy(self) -> list[int]:
        """Indices of the GPUs taken out of use, ascending."""
        return self._health.unhealthy()

    def resettable(self) -> list[int]:
        """Of those, the ones a reset may bring back."""
        return self._health.resettable()

    def start(self, on_error: ErrorSink) -> None:
        """Begin reporting errors to ``on_error``, XID events from a thread of their own."""
        self._health.start(on_error)
        if not self._handles:
            return
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except Exception as error:
            log.warning("NVML event set failed (%s): XID events are not watched", error)
            return
        watched = 0
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, _NVML_EVENT_TYPE_XID_CRITICAL_ERROR, self._event_set
                )
                watched += 1
            except Exception as error:
                log.warning("GPU %d: XID events cannot be watched (%s)", index, error)
        if watched:
            self._thread = threading.Thread(
                target=self._watch_events, name="nvml-xid-events", daemon=True
            )
            self._thread.start()

    def readings(self) -> list[GpuReading]:
        """One NVML reading per GPU, in index order."""
        return [self._reading(index) for index in range(len(self._handles))]

    def reset(self, gpu: int, command: str, timeout: float) -> ResetOutcome:
        """Reset GPU ``gpu`` once no compute process uses it (waiting at most ``timeout``
        seconds), by ``command`` (``{index}`` and ``{uuid}`` filled in, at most
        ``timeout`` seconds), then read it again; a GPU not out of use needs none."""
        if not 0 <= gpu < len(self._handles):
            return ResetOutcome(False, False, f"no GPU {gpu} on this node")
        if not self._health.is_unhealthy(gpu):
            return ResetOutcome(True, False, f"GPU {gpu} is in use: no reset needed")
        busy = self._wait_idle(gpu, timeout)
        if busy:
            return ResetOutcome(
                False, False, f"GPU {gpu}: {busy} process(es) still use it after {timeout:g} s"
            )
        uuid = self._uuids[gpu]
        line = command.format(index=gpu, uuid=uuid)
        failed = run_command(line, timeout)
        if failed is not None:
            return ResetOutcome(False, False, f"GPU {gpu}: {failed}")
        try:  # the reset GPU answers again, under the same UUID
            handle = self._nvml.nvmlDeviceGetHandleByIndex(gpu)
            again = _text(self._nvml.nvmlDeviceGetUUID(handle))
        except Exception as error:
            return ResetOutcome(False, True, f"GPU {gpu} does not answer after its reset: {error}")
        if again != uuid:
            return ResetOutcome(False, True, f"GPU {gpu} came back as {again}, not {uuid}")
        with self._lock:
            self._handles[gpu] = handle
            self._lost.discard(gpu)
            self._ecc_seen.pop(gpu, None)  # the volatile counters start again at a reset
        self._watch_xids(gpu, handle)
        self._health.heal(gpu)
        return ResetOutcome(True, True, f"GPU {gpu} reset ({line})")

    def _wait_idle(self, gpu: int, timeout: float) -> int:
        """Wait until no compute process uses GPU ``gpu``, at most ``timeout`` seconds;
        how many still do (0 also where NVML cannot list them)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handles[gpu])
            except Exception as error:
                log.info("GPU %d: its processes cannot be listed (%s); resetting", gpu, error)
                return 0
            if not processes or time.monotonic() >= deadline:
                return len(processes)
            time.sleep(0.5)

    def _watch_xids(self, gpu: int, handle: Any) -> None:
        """Register a reset GPU's XID events again (its old registration may be gone)."""
        if self._event_set is None:
            return
        try:
            self._nvml.nvmlDeviceRegisterEvents(
                handle, _NVML_EVENT_TYPE_XID_CRITICAL_ERROR, self._event_set
            )
        except Exception as error:
            log.warning("GPU %d: XID events cannot be watched after its reset (%s)", gpu, error)

    def close(self) -> None:
        """Stop watching XID events and shut NVML down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._event_wait_ms / 1000 + 5)
            self._thread = None
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except Exception as error:
                log.debug("freeing the NVML event set failed: %s", error)
            self._event_set = None
        self._shutdown_nvml()

    def _shutdown_nvml(self) -> None:
        if self._nvml is None:
            return
        nvml, self._nvml = self._nvml, None
        try:
            nvml.nvmlShutdown()
        except Exception as error:
            log.debug("nvmlShutdown failed: %s", error)

    # readings

    def _reading(self, index: int) -> GpuReading:
        uuid = self._uuids[index]
        with self._lock:
            lost = index in self._lost
        if lost:
            return GpuReading(index=index, uuid=uuid, healthy=False)
        try:
            return self._query_all(index, uuid)
        except _GpuLost:
            return GpuReading(index=index, uuid=uuid, healthy=False)

    def _query_all(self, index: int, uuid: str) -> GpuReading:
        nvml, handle = self._nvml, self._handles[index]
        utilization = self._query(index, nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._query(index, nvml.nvmlDeviceGetMemoryInfo, handle)
        temperature = self._query(
            index, nvml.nvmlDeviceGetTemperature, handle, _NVML_TEMPERATURE_GPU
        )
        power_mw = self._query(index, nvml.nvmlDeviceGetPowerUsage, handle)
        ecc = self._query(
            index,
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            _NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            _NVML_VOLATILE_ECC,
        )
        corrected = self._query(
            index,
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            _NVML_MEMORY_ERROR_TYPE_CORRECTED,
            _NVML_VOLATILE_ECC,
        )
        retired = self._retired(index, handle)
        throttle = self._throttle_reasons(index, handle)
        if ecc is not None:
            self._check_ecc(index, uuid, int(ecc))
        return GpuReading(
            index=index,
            uuid=uuid,
            utilization_percent=None if utilization is None else float(utilization.gpu),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            temperature_c=None if temperature is None else float(temperature),
            power_watts=None if power_mw is None else power_mw / 1000.0,
            ecc_uncorrected=None if ecc is None else int(ecc),
            retired_pages=retired,
            ecc_corrected=None if corrected is None else int(corrected),
            throttle_reasons=throttle,
            healthy=not self._health.is_unhealthy(index),
        )

    def _throttle_reasons(self, index: int, handle: Any) -> list[str] | None:
        """The clocks' current throttle reasons by name; None where NVML cannot say."""
        call = next((c for c in map(self._nvml_call, _THROTTLE_CALLS) if c is not None), None)
        if call is None:
            return None
        mask = self._query(index, call, handle)
        if mask is None:
            return None
        bits = int(mask)
        return [name for bit, name in THROTTLE_REASONS.items() if bits & bit]

    def _nvml_call(self, name: str) -> Callable[..., Any] | None:
        found: Callable[..., Any] | None = getattr(self._nvml, name, None)
        return found

    def _retired(self, index: int, handle: Any) -> int | None:
        """Remapped rows (Ampere and newer), else retired pages (older GPUs)."""
        nvml = self._nvml
        rows = self._query(index, nvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            corrected, uncorrected, _pending, _failed = rows
            return int(corrected) + int(uncorrected)
        pages = [
            self._query(index, nvml.nvmlDeviceGetRetiredPages, handle, cause)
            for cause in _NVML_RETIREMENT_CAUSES
        ]
        if all(found is None for found in pages):
            return None
        return sum(len(found) for found in pages if found is not None)

    def _query(self, index: int, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``; None where unsupported or failing; a lost GPU is reported."""
        try:
            return call(*args)
        except self._nvml_error() as error:
            code = getattr(error, "value", None)
            if code == _NVML_ERROR_GPU_IS_LOST:
                self._lose(index, f"{getattr(call, '__name__', 'query')}: {error}")
                raise _GpuLost from None
            if code != _NVML_ERROR_NOT_SUPPORTED:
                name = getattr(call, "__name__", "query")
                self._failures.warning(f"{index}:{name}", f"GPU {index}: {name} failed: {error}")
            return None

    def _nvml_error(self) -> type[Exception]:
        error: type[Exception] = getattr(self._nvml, "NVMLError", Exception)
        return error

    def _lose(self, index: int, detail: str) -> None:
        with self._lock:
            if index in self._lost:
                return
            self._lost.add(index)
        self._health.report(
            GpuErrorReport(
                gpu=index,
                uuid=self._uuids[index],
                error="fell_off_bus",
                message=f"GPU {index} fell off the bus (NVML: GPU is lost; {detail})",
            )
        )

    def _check_ecc(self, index: int, uuid: str, count: int) -> None:
        with self._lock:
            seen = self._ecc_seen.get(index)
            self._ecc_seen[index] = count
        if seen is None:
            if count:
                log.warning("GPU %d already has %d volatile uncorrected ECC errors", index, count)
            return
        if count > seen:
            self._health.report(
                GpuErrorReport(
                    gpu=index,
                    uuid=uuid,
                    error="ecc",
                    message=f"volatile uncorrected ECC errors rose from {seen} to {count}",
                )
            )

    # XID events

    def _watch_events(self) -> None:
        nvml = self._nvml
        error_type = self._nvml_error()
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(self._event_set, self._event_wait_ms)
            except error_type as error:
                if getattr(error, "value", None) != _NVML_ERROR_TIMEOUT:
                    self._failures.warning("event-wait", f"waiting for NVML events failed: {error}")
                    self._stop.wait(1.0)  # bounded retry pace, not synchronisation
                continue
            except Exception as error:  # NVML shut down under us
                if not self._stop.is_set():
                    log.warning("NVML event watch ended: %s", error)
                return
            if not int(data.eventType) & _NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                continue
            xid = int(data.eventData)
            for index in self._indices_of(data.device):
                self._health.report(
                    GpuErrorReport(
                        gpu=index,
                        uuid=self._uuids[index],
                        error="xid",
                        xid=xid,
                        message=_xid_message(xid),
                    )
                )

    def _indices_of(self, device: Any) -> Sequence[int]:
        """The GPU an event names; every GPU where NVML cannot say which."""
        try:
            uuid = _text(self._nvml.nvmlDeviceGetUUID(device))
        except Exception:
            return range(len(self._handles))
        if uuid in self._uuids:
            return [self._uuids.index(uuid)]
        return range(len(self._handles))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# What an injected corrected-ecc sign adds to the simulated GPU's count every sample.
_CORRECTED_PER_SAMPLE = 60


class SimulatedGpus:
    """Made-up GPUs for a local virtual node: plausible readings, injected XIDs."""

    simulated = True

    _MEMORY_TOTAL = 80 * 1024**3

    def __init__(self, count: int, *, seed: int | str | None = None) -> None:
        if count < 0:
            raise ValueError("a node cannot have fewer than 0 GPUs")
        self._count = count
        self._health = _Health()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._ecc = [0] * count
        self._retired = [0] * count
        self._corrected = [0] * count
        self._signs: list[set[WarningSign]] = [set() for _ in range(count)]
        self._broken_resets: set[int] = set()
        self._uuids = [f"sim-{self._random.getrandbits(64):016x}-{i}" for i in range(count)]

    @property
    def count(self) -> int:
        """How many GPUs are simulated."""
        return self._count

    @property
    def uuids(self) -> list[str]:
        """Each GPU's made-up UUID, in index order."""
        return list(self._uuids)

    def start(self, on_error: ErrorSink) -> None:
        """Begin reporting injected errors to ``on_error``."""
        self._health.start(on_error)

    def unhealthy(self) -> list[int]:
        """Indices of the GPUs taken out of use, ascending."""
        return self._health.unhealthy()

    def resettable(self) -> list[int]:
        """Of those, the ones a reset may bring back."""
        return self._health.resettable()

    def readings(self) -> list[GpuReading]:
        """One plausible reading per GPU, in index order."""
        with self._lock:
            return [self._reading(i) for i in range(self._count)]

    def _reading(self, index: int) -> GpuReading:
        healthy = not self._health.is_unhealthy(index)
        busy = self._random.uniform(60.0, 99.0) if healthy else 0.0
        signs = self._signs[index]
        if "corrected-ecc" in signs:
            self._corrected[index] += _CORRECTED_PER_SAMPLE
        if "retired-pages" in signs:
            self._retired[index] += 1
        hot = "thermal" in signs
        return GpuReading(
            index=index,
            uuid=self._uuids[index],
            utilization_percent=round(busy, 1),
            memory_used_bytes=int(self._MEMORY_TOTAL * busy / 100 * 0.8),
            memory_total_bytes=self._MEMORY_TOTAL,
            temperature_c=round(
                (88.0 if hot else 35.0 + busy * 0.4) + self._random.uniform(-2.0, 2.0), 1
            ),
            power_watts=round(70.0 + busy * 5.5 + self._random.uniform(-10.0, 10.0), 1),
            ecc_uncorrected=self._ecc[index],
            retired_pages=self._retired[index],
            ecc_corrected=self._corrected[index],
            throttle_reasons=["sw_thermal", "hw_thermal"] if hot else [],
            healthy=healthy,
        )

    def inject_warning(self, gpu: int, sign: WarningSign) -> None:
        """Make GPU ``gpu``'s readings show ``sign`` from the next sample on: its
        corrected ECC count rising by a fixed amount every sample, one more retired page
        every sample, or its clocks thermally throttled (and the GPU hot)."""
        if not 0 <= gpu < self._count:
            raise IndexError(f"no GPU {gpu}: this node has {self._count} (0..{self._count - 1})")
        with self._lock:
            self._signs[gpu].add(sign)

    def inject_xid(self, gpu: int, xid: int) -> GpuErrorReport:
        """Raise XID ``xid`` on GPU ``gpu``, as NVML would report it; returns the report."""
        if not 0 <= gpu < self._count:
            raise IndexError(f"no GPU {gpu}: this node has {self._count} (0..{self._count - 1})")
        with self._lock:
            if xid in (48, 94, 95, 140):  # uncorrectable memory errors count as ECC errors
                self._ecc[gpu] += 1
            elif xid in (63, 64):  # a row remapped (or not)
                self._retired[gpu] += 1
        report = GpuErrorReport(
            gpu=gpu, uuid=self._uuids[gpu], error="xid", xid=xid, message=_xid_message(xid)
        )
        self._health.report(report)
        return report

    def break_resets(self, gpu: int) -> None:
        """Make every reset of GPU ``gpu`` fail from now on (until :meth:`repair`)."""
        with self._lock:
            self._broken_resets.add(gpu)

    def reset(self, gpu: int, command: str, timeout: float) -> ResetOutcome:
        """A simulated reset: GPU ``gpu`` is healthy again at once (its warning signs and
        counters kept: a reset does not mend the memory), unless its resets were broken;
        ``command`` and ``timeout`` are not used. A GPU not out of use needs none."""
        if not 0 <= gpu < self._count:
            return ResetOutcome(False, False, f"no GPU {gpu} on this node")
        if not self._health.is_unhealthy(gpu):
            return ResetOutcome(True, False, f"GPU {gpu} is in use: no reset needed")
        with self._lock:
            broken = gpu in self._broken_resets
        if broken:
            return ResetOutcome(
                False, False, f"simulated GPU {gpu} did not come back from its reset"
            )
        self._health.heal(gpu)
        return ResetOutcome(True, True, f"simulated GPU {gpu} reset")

    def repair(self) -> list[int]:
        """The node was repaired: every GPU is healthy again and shows no warning sign,
        its error counters kept (as a real GPU's are). The GPUs that were unhealthy."""
        with self._lock:
            for signs in self._signs:
                signs.clear()
            self._broken_resets.clear()
        return self._health.clear()

    def close(self) -> None:
        """Nothing to release."""


def select_gpus(requested: int, node: str | None = None, *, nvml: Any | None = None) -> GpuSource:
    """NVML's GPUs; simulated ones where NVML has none and ``requested`` > 0 (or where
    ``RESURGE_SIMULATE_GPUS=1``). ``node`` seeds the simulated GPUs' UUIDs; ``nvml``
    replaces the ``pynvml`` module (tests)."""
    if os.environ.get(SIMULATE_GPUS, "") in ("1", "true", "yes") and requested > 0:
        log.info("simulating %d GPUs (%s is set)", requested, SIMULATE_GPUS)
        return SimulatedGpus(requested, seed=node)
    real = NvmlGpus(nvml)
    if real.count > 0 or requested == 0:
        if real.count:
            log.info("monitoring %d NVIDIA GPUs through NVML", real.count)
        return real
    real.close()
    log.info("simulating %d GPUs", requested)
    return SimulatedGpus(requested, seed=node)


def monitoring(source: GpuSource) -> Literal["nvml", "simulated", "none"]:
    """How ``source`` watches the node's GPUs: simulated ones, real ones through NVML, or
    none (NVML found no GPU: no XID and no GPU health is watched)."""
    if source.simulated:
        return "simulated"
    return "nvml" if source.count else "none"
