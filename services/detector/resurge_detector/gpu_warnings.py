"""GPU warning-sign detector: readings that tend to come before a GPU fails (pure).

Per GPU of each node, from its GpuSamples (and GpuErrors), a warning sign shows when:

- ``corrected_ecc_rising``: its volatile corrected ECC count rose by at least
  ``ecc_rise`` within ``window_seconds`` (a count that falls, the driver reloaded,
  starts over);
- ``retired_pages_growing``: its retired pages (or remapped rows) grew by at least
  ``retired_growth`` within ``window_seconds``;
- ``thermal_throttling`` / ``power_throttling``: every sample for ``throttle_seconds``
  had its clocks held down for heat (``hw_thermal``, ``sw_thermal``) or by the power
  brake (``hw_power_brake``, ``hw_slowdown``); ``sw_power_cap`` alone, a GPU at its
  power limit, is ordinary under training and no sign;
- ``xid_precursor``: an XID known to precede failures (``precursor_xids``: 63, a row
  remapped or page retired; 92, a high single-bit ECC rate; both ignored by the XID
  table, so nothing else acts on them).

A sign that shows opens a warning: one alert-only, node-scoped FaultDetected of reason
``gpu_warning`` for each running job on the node (a fault belongs to a job; the node
ledger counts one cause on a node once), evidence ``{node, gpu, uuid, sign, since, ...}``
with the numbers behind it. While the sign keeps showing nothing more is said; once it
has not shown for ``quiet_seconds`` the warning is over, and its next showing is a new
one. The restarter's fault path acts on no alert; its node ledger counts the warning
against the node and, for a sign that predicts a failure, moves the jobs off the node
at their next checkpoint (``RESURGE_NODE_PROACTIVE_MOVES``). A node with no job on it
raises no fault.

Thresholds are the detector's settings, ``RESURGE_GPU_WARNING_*``
(:class:`GpuWarningSettings`, read when the detector is made).
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pydantic import Field

from resurge.detection import DetectorContext
from resurge.events import Envelope, FaultScope, GpuError, GpuReading, GpuSample
from resurge.runtime.settings import Settings

__all__ = ["PREDICTIVE_SIGNS", "GpuWarningDetector", "GpuWarningSettings"]

# Signs that predict a failure of the GPU (the ledger moves jobs off the node for them).
PREDICTIVE_SIGNS = frozenset({"corrected_ecc_rising", "retired_pages_growing", "xid_precursor"})

_THROTTLES = {
    "thermal_throttling": frozenset({"hw_thermal", "sw_thermal"}),
    "power_throttling": frozenset({"hw_power_brake", "hw_slowdown"}),
}

Numbers = dict[str, str | int | float | bool | None]


class GpuWarningSettings(Settings):
    """The warning-sign detector's thresholds (``RESURGE_GPU_WARNING_*``)."""

    gpu_warning_ecc_rise: int = Field(
        default=100, ge=1, description="Corrected ECC errors within the window that are a sign."
    )
    gpu_warning_retired_growth: int = Field(
        default=1, ge=1, description="Retired pages (remapped rows) within the window."
    )
    gpu_warning_window_seconds: float = Field(
        default=3600.0, gt=0, description="The window the ECC rise and page growth count in."
    )
    gpu_warning_throttle_seconds: float = Field(
        default=300.0, ge=0, description="How long thermal or power throttling must last."
    )
    gpu_warning_quiet_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="A sign not shown this long ends its warning; it may warn again after.",
    )
    gpu_warning_xids: str = Field(
        default="63,92", description="XIDs known to precede failures, comma-separated."
    )

    def precursor_xids(self) -> frozenset[int]:
        """The XIDs of ``gpu_warning_xids``."""
        return frozenset(int(x) for x in self.gpu_warning_xids.split(",") if x.strip())


@dataclass
class _Warning:
    since: datetime
    seen: datetime


@dataclass
class _Gpu:
    corrected: deque[tuple[datetime, int]] = field(default_factory=deque)
    retired: deque[tuple[datetime, int]] = field(default_factory=deque)
    throttled_since: dict[str, datetime] = field(default_factory=dict)
    warnings: dict[str, _Warning] = field(default_factory=dict)


class GpuWarningDetector:
    """Warning signs in GPU readings, one alert per sign and warning (module docstring)."""

    name = "gpu_warnings"
    kinds = frozenset({"gpu_sample", "gpu_error"})

    def __init__(self, settings: GpuWarningSettings | None = None) -> None:
        self.settings = settings or GpuWarningSettings()
        self.window = timedelta(seconds=self.settings.gpu_warning_window_seconds)
        self.quiet = timedelta(seconds=self.settings.gpu_warning_quiet_seconds)
        self.xids = self.settings.precursor_xids()
        self._gpus: dict[tuple[str, int], _Gpu] = {}

    def observe(self, event: GpuSample | GpuError, ctx: DetectorContext) -> list[Envelope]:
        """The faults of the warnings that this event opens."""
        node = event.node
        if node is None:
            return []
        if isinstance(event, GpuError):
            if event.error != "xid" or event.xid not in self.xids:
                return []
            gpu = self._gpu(node, event.gpu)
            numbers: Numbers = {"xid": event.xid, "message": event.message}
            return self._shown(node, event.gpu, event.uuid, gpu, "xid_precursor", numbers, ctx)
        out: list[Envelope] = []
        for reading in event.gpus:
            gpu = self._gpu(node, reading.index)
            for sign, shown in self._signs(gpu, reading, ctx.now).items():
                if shown is not None:
                    out += self._shown(node, reading.index, reading.uuid, gpu, sign, shown, ctx)
            for sign, warning in list(gpu.warnings.items()):
                if ctx.now - warning.seen > self.quiet:
                    del gpu.warnings[sign]
        return out

    def tick(self, ctx: DetectorContext) -> list[Envelope]:
        """Nothing: every sign is judged on a reading."""
        return []

    def _gpu(self, node: str, index: int) -> _Gpu:
        key = (node, index)
        gpu = self._gpus.get(key)
        if gpu is None:
            gpu = self._gpus[key] = _Gpu()
        return gpu

    def _signs(self, gpu: _Gpu, reading: GpuReading, now: datetime) -> dict[str, Numbers | None]:
        """Each sign of ``reading``: its numbers where it shows, else None."""
        s = self.settings
        signs: dict[str, Numbers | None] = {
            "corrected_ecc_rising": self._rise(
                gpu.corrected, reading.ecc_corrected, now, s.gpu_warning_ecc_rise, "ecc_corrected"
            ),
            "retired_pages_growing": self._rise(
                gpu.retired,
                reading.retired_pages,
                now,
                s.gpu_warning_retired_growth,
                "retired_pages",
            ),
        }
        reasons = set(reading.throttle_reasons or ())
        for sign, causes in _THROTTLES.items():
            signs[sign] = None
            held = sorted(reasons & causes)
            if not held:
                gpu.throttled_since.pop(sign, None)
                continue
            since = gpu.throttled_since.setdefault(sign, now)
            lasted = (now - since).total_seconds()
            if lasted >= s.gpu_warning_throttle_seconds:
                signs[sign] = {
                    "throttle_reasons": ",".join(held),
                    "throttled_seconds": round(lasted, 1),
                    "temperature_c": reading.temperature_c,
                    "power_watts": reading.power_watts,
                }
        return signs

    def _rise(
        self,
        history: deque[tuple[datetime, int]],
        count: int | None,
        now: datetime,
        threshold: int,
        what: str,
    ) -> Numbers | None:
        """Record ``count``; its rise within the window where that reaches ``threshold``."""
        if count is None:
            return None
        if history and count < history[-1][1]:
            history.clear()  # a volatile count reset (driver reload): start over
        history.append((now, count))
        while history and now - history[0][0] > self.window:
            history.popleft()
        first_at, first = history[0]
        rise = count - first
        if rise < threshold:
            return None
        return {
            what: count,
            "rise": rise,
            "over_seconds": round((now - first_at).total_seconds(), 1),
            "threshold": threshold,
        }

    def _shown(
        self,
        node: str,
        index: int,
        uuid: str,
        gpu: _Gpu,
        sign: str,
        numbers: Numbers,
        ctx: DetectorContext,
    ) -> list[Envelope]:
        """Note that ``sign`` showed; the faults of a warning it opens (none while open)."""
        warning = gpu.warnings.get(sign)
        if warning is not None and ctx.now - warning.seen <= self.quiet:
            warning.seen = ctx.now
            return []
        warning = gpu.warnings[sign] = _Warning(since=ctx.now, seen=ctx.now)
        since = warning.since.isoformat()
        words = sign.replace("_", " ")
        out: list[Envelope] = []
        for record in ctx.jobs_on(node):
            replicas = sorted(p.replica for p in record.placements if p.node == node)
            fault_id = f"gpu_warning:{node}:{index}:{sign}:{since}:{record.name}"
            out.append(
                ctx.fault(
                    fault_id=fault_id,
                    reason="gpu_warning",
                    scope=FaultScope.NODE,
                    message=f"GPU {index} on {node}: {words} ({_said(numbers)}); "
                    f"a warning sign for job {record.name}",
                    evidence={
                        "node": node,
                        "gpu": index,
                        "uuid": uuid,
                        "sign": sign,
                        "since": since,
                        "predictive": sign in PREDICTIVE_SIGNS,
                        "replicas": ",".join(map(str, replicas)),
                        **numbers,
                    },
                    alert_only=True,
                    id="gpuwarn-" + hashlib.sha256(fault_id.encode()).hexdigest()[:40],
                    job=record.name,
                    generation=record.generation,
                    node=node,
                    replica=replicas[0] if replicas else None,
                )
            )
        return out


def _said(numbers: Numbers) -> str:
    return ", ".join(f"{k} {v}" for k, v in numbers.items() if k != "message" and v is not None)
