"""``monitor`` mode: one per node. Reports the node and runs the worker groups placed on it.

- GPUs: NVML's when it finds any (:class:`~resurge_node_agent.gpus.NvmlGpus`); where
  NVML has none (no driver, as on a laptop or CI) and ``--gpus M`` is above 0, ``M``
  simulated GPUs (:class:`~resurge_node_agent.gpus.SimulatedGpus`), which is what the local
  cluster's virtual nodes get. ``RESURGE_SIMULATE_GPUS=1`` simulates even where NVML
  finds GPUs. The node offers ``--gpus`` slots either way.
- Every heartbeat (and whenever a worker group or a GPU's health changes) it writes the
  node's record to the ``nodes`` bucket (``healthy`` false while a GPU is unhealthy),
  publishes a NodeReport on ``raw._.node_report.<node>`` (stored, acked) and a GpuSample
  on ``raw._.gpu_sample.<node>`` (not waited for). The detector's node-health detector
  turns these reports into CapacityChanged events (a node appearing, changing, lost).
- Every GPU error (XID event, GPU fallen off the bus, rise in uncorrected ECC errors) is
  published as a GpuError on ``raw._.gpu_error.<node>`` as it happens. A GPU whose XID
  calls for ``reset_gpu`` or ``replace_node`` (built-in XID table), or that fell off the
  bus, stays unhealthy until the monitor restarts.
- Commands to the node arrive on ``cmd._.<node>`` (durable consumer
  ``monitor-<node>``, new messages only): InjectGpuError raises an XID on a simulated GPU
  and is ignored, with a log line, on NVML GPUs.
- Watches the ``workergroups`` bucket for keys under this node, and reconciles them as a
  kubelet reconciles pods: a new key starts a ``resurge-node-agent launch`` process, a
  bumped ``incarnation`` recreates it, a deleted key stops it. A launch agent that exits
  non-zero while its key still exists is started again (restartPolicy OnFailure).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from resurge.cluster.local import LocalBackend
from resurge.cluster.protocol import NodeInfo, WorkerGroupSpec
from resurge.contract.subjects import NODE_LEVEL_JOB, escape_token
from resurge.events import (
    AgentState,
    AgentStateChanged,
    GpuError,
    GpuSample,
    InjectGpuError,
    NodeReport,
)
from resurge.runtime.bus import PermanentError
from resurge.runtime.service import ServiceContext
from resurge_node_agent.gpus import GpuErrorReport, GpuSource, SimulatedGpus, select_gpus

__all__ = ["MonitorConfig", "NodeMonitor"]

HEARTBEAT_SECONDS = 3.0
_RESTART_BACKOFF_SECONDS = 1.0
_PUBLISH_ATTEMPTS = 5


@dataclass(frozen=True)
class MonitorConfig:
    node: str
    slots: int
    address: str
    log_dir: Path | None


@dataclass
class _Running:
    spec: WorkerGroupSpec
    process: asyncio.subprocess.Process
    stopping: bool = False


class NodeMonitor:
    def __init__(
        self, ctx: ServiceContext, config: MonitorConfig, gpus: GpuSource | None = None
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.groups: dict[str, _Running] = {}
        self.backend: LocalBackend | None = None
        self.gpus = gpus
        self._gpu_errors: asyncio.Queue[GpuErrorReport] = asyncio.Queue()
        self._reporting = asyncio.Lock()

    @property
    def free_slots(self) -> int:
        used = sum(r.spec.nproc for r in self.groups.values() if not r.stopping)
        return max(0, self.config.slots - used)

    @property
    def unhealthy_gpus(self) -> list[int]:
        return [] if self.gpus is None else self.gpus.unhealthy()

    async def start(self) -> None:
        bus = self.ctx.bus
        self.backend = await LocalBackend.open(bus)
        self.ctx.exit_stack.push_async_callback(self._shutdown)
        if self.gpus is None:
            self.gpus = await asyncio.to_thread(select_gpus, self.config.slots, self.config.node)
        gpus = self.gpus

        async def close_gpus() -> None:
            await asyncio.to_thread(gpus.close)  # joins NVML's event thread

        self.ctx.exit_stack.push_async_callback(close_gpus)
        loop = asyncio.get_running_loop()
        queue = self._gpu_errors

        def on_gpu_error(report: GpuErrorReport) -> None:  # any thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the monitor is gone
                loop.call_soon_threadsafe(queue.put_nowait, report)

        gpus.start(on_gpu_error)
        self.ctx.spawn(self._publish_gpu_errors())
        # Bound before the first report, so a NodeReport seen means commands are heard.
        await bus.consume(
            bus.subjects.node_cmd(self.config.node),
            f"monitor-{escape_token(self.config.node)}",
            self._on_command,
            expects=(InjectGpuError,),
            start="new",
        )
        await self._report()
        watcher = await self.backend.groups.watch(f"{escape_token(self.config.node)}.>")
        self.ctx.spawn(self._reconcile(watcher))
        self.ctx.spawn(self._heartbeat())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                await self._report()
            except Exception:  # a missed beat, not a dead monitor
                self.ctx.log.exception("could not report node %s", self.config.node)

    async def _report(self) -> None:
        async with self._reporting:
            await self._report_now()

    async def _report_now(self) -> None:
        assert self.backend is not None
        bus, node = self.ctx.bus, self.config.node
        readings = [] if self.gpus is None else await asyncio.to_thread(self.gpus.readings)
        unhealthy = self.unhealthy_gpus
        healthy = not unhealthy
        info = NodeInfo(
            name=node,
            slots=self.config.slots,
            healthy=healthy,
            address=self.config.address,
            heartbeat=datetime.now(UTC),
        )
        await self.backend.put_node(info)
        free = self.free_slots
        report = NodeReport(
            source=bus.source,
            node=node,
            slots_total=self.config.slots,
            slots_free=free,
            healthy=healthy,
            unhealthy_gpus=unhealthy,
        )
        await bus.publish(bus.subjects.raw(NODE_LEVEL_JOB, "node_report", node), report)
        if readings:
            sample = GpuSample(
                source=bus.source,
                node=node,
                gpus=readings,
                simulated=bool(self.gpus is not None and self.gpus.simulated),
            )
            await bus.publish_nowait(bus.subjects.raw(NODE_LEVEL_JOB, "gpu_sample", node), sample)

    async def _publish_gpu_errors(self) -> None:
        bus, node = self.ctx.bus, self.config.node
        while True:
            report = await self._gpu_errors.get()
            event = GpuError(
                source=bus.source,
                node=node,
                gpu=report.gpu,
                uuid=report.uuid,
                error=report.error,
                xid=report.xid,
                message=report.message,
            )
            self.ctx.log.warning("GPU %d error (%s): %s", report.gpu, report.error,
                                 report.message, extra={"node": node})  # fmt: skip
            subject = bus.subjects.raw(NODE_LEVEL_JOB, "gpu_error", node)
            for attempt in range(1, _PUBLISH_ATTEMPTS + 1):
                try:  # the same event id each time: the stream keeps one copy
                    await bus.publish(subject, event)
                    break
                except Exception as error:
                    self.ctx.log.warning("publishing GPU %d's error failed (%d of %d): %s",
                                         report.gpu, attempt, _PUBLISH_ATTEMPTS, error)  # fmt: skip
                    await asyncio.sleep(_RESTART_BACKOFF_SECONDS)  # retry pace
            if report.gpu in self.unhealthy_gpus:
                try:
                    await self._report()  # tell the cluster now, not at the next beat
                except Exception:
                    self.ctx.log.exception("could not report node %s", node)

    async def _on_command(self, event: InjectGpuError) -> None:
        gpus = self.gpus
        if not isinstance(gpus, SimulatedGpus):
            self.ctx.log.warning(
                "ignoring injected XID %d for GPU %d: this node's GPUs are real (NVML)",
                event.xid, event.gpu, extra={"event_id": event.id},
            )  # fmt: skip
            return
        try:
            gpus.inject_xid(event.gpu, event.xid)
        except IndexError as error:
            raise PermanentError(f"node {self.config.node}: {error}") from None
        self.ctx.log.info("injected XID %d into simulated GPU %d", event.xid, event.gpu,
                          extra={"event_id": event.id})  # fmt: skip

    async def _reconcile(self, watcher: object) -> None:
        async for entry in watcher:  # type: ignore[attr-defined]
            if entry is None:  # end of the initial values
                continue
            try:
                if entry.operation in ("DEL", "PURGE"):
                    await self._remove(entry.key)
                else:
                    await self._apply(entry.key, WorkerGroupSpec.model_validate_json(entry.value))
            except Exception:
                self.ctx.log.exception("could not reconcile worker group %s", entry.key)
            await self._report()

    async def _apply(self, key: str, spec: WorkerGroupSpec) -> None:
        running = self.groups.get(key)
        unchanged = running is not None and running.spec.incarnation == spec.incarnation
        if unchanged and running is not None and running.process.returncode is None:
            return
        if running is not None:
            await self._remove(key)
        await self._launch(key, spec)

    async def _launch(self, key: str, spec: WorkerGroupSpec) -> None:
        argv = [
            sys.executable, "-m", "resurge_node_agent", "launch",
            "--job", spec.job,
            "--replica", str(spec.replica),
            "--nproc-per-node", str(spec.nproc),
            "--node", self.config.node,
            "--stop-grace-seconds", str(spec.stop_grace_seconds),
            *(["--working-dir", spec.working_dir] if spec.working_dir else []),
            *(f"--env={name}={value}" for name, value in spec.env.items()),
            *([] if spec.fork_server else ["--no-fork-server"]),
            f"--preload={','.join(spec.preload)}",
            "--incarnation", str(spec.incarnation),
            "--", *spec.command,
        ]  # fmt: skip
        output = self._log_file(spec)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if output is not None:
                output.close()
        self.groups[key] = _Running(spec, process)
        self.ctx.log.info(
            "started worker group %s (pid %d, incarnation %d)",
            key,
            process.pid,
            spec.incarnation,
            extra={"job": spec.job, "replica": spec.replica},
        )
        self.ctx.spawn(self._watch(key, spec, process))

    def _log_file(self, spec: WorkerGroupSpec):  # type: ignore[no-untyped-def]
        if self.config.log_dir is None:
            return None
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        name = f"agent-{escape_token(spec.job)}-{spec.replica}.log"
        return (self.config.log_dir / name).open("ab")

    async def _watch(
        self, key: str, spec: WorkerGroupSpec, process: asyncio.subprocess.Process
    ) -> None:
        code = await process.wait()
        running = self.groups.get(key)
        if running is None or running.process is not process:
            return
        if running.stopping or code == 0:
            self.groups.pop(key, None)
            await self._report()
            return
        self.ctx.log.warning(
            "worker group %s exited with %d; starting it again", key, code,
            extra={"job": spec.job, "replica": spec.replica},
        )  # fmt: skip
        # Its workers died with it: say so, so the job gets a new generation at once.
        lost = AgentStateChanged(
            source=self.ctx.bus.source, job=spec.job, replica=spec.replica,
            node=self.config.node, state=AgentState.LOST,
            detail=f"the agent (pid {process.pid}, incarnation {spec.incarnation}) exited "
            f"with {code} without being stopped",
        )  # fmt: skip
        with contextlib.suppress(Exception):  # the restart below matters more
            await self.ctx.bus.publish(
                self.ctx.bus.subjects.raw(spec.job, lost.kind, self.config.node), lost
            )
        await asyncio.sleep(_RESTART_BACKOFF_SECONDS)
        if self.groups.get(key) is running:
            await self._launch(key, spec)

    async def _remove(self, key: str) -> None:
        running = self.groups.get(key)
        if running is None:
            return
        running.stopping = True
        await _terminate(running.process, running.spec.stop_grace_seconds + 5)
        if self.groups.get(key) is running:
            self.groups.pop(key)

    async def _shutdown(self) -> None:
        await asyncio.gather(*(self._remove(key) for key in list(self.groups)))


async def _terminate(process: asyncio.subprocess.Process, grace: float) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
