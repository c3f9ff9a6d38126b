"""``monitor`` mode: one per node. Reports the node and runs the worker groups placed on it.

- GPUs: NVML's when it finds any (:class:`~resurge_node_agent.monitor.gpus.NvmlGpus`); where
  NVML has none (no driver, as on a laptop or CI) and ``--gpus M`` is above 0, ``M``
  simulated GPUs (:class:`~resurge_node_agent.monitor.gpus.SimulatedGpus`), which is what the local
  cluster's virtual nodes get. ``RESURGE_SIMULATE_GPUS=1`` simulates even where NVML
  finds GPUs. The node offers ``--gpus`` slots where given, else the GPUs NVML found
  (none simulated: a monitor without NVML and without ``--gpus`` watches no GPU). On
  Kubernetes the node's allocatable accelerator decides its slots
  (:func:`resurge.cluster.kubernetes.objects.node_info`), and how the GPUs are watched
  (NVML, simulated, not at all) is reported with every report (``gpu_monitoring``),
  which the backend shows on the Node as a condition and Events.
- Every heartbeat (and whenever a worker group or a GPU's health changes) it reports the
  node to the cluster backend (``healthy`` false while a GPU is unhealthy; the
  ``--label`` labels as the node's labels), and publishes a NodeReport on
  ``raw._.node_report.<node>`` and a GpuSample on ``raw._.gpu_sample.<node>`` (not
  waited for: a newer one supersedes each). The detector's node-health detector
  turns these reports into CapacityChanged events (a node appearing, changing, lost).
- Every GPU error (XID event, GPU fallen off the bus, rise in uncorrected ECC errors) is
  published as a GpuError on ``raw._.gpu_error.<node>`` as it happens. A GPU whose XID
  calls for ``reset_gpu`` or ``replace_node`` (built-in XID table), or that fell off the
  bus, stays unhealthy until it is reset (ResetGpu, CheckNode) or the monitor restarts;
  one whose XID calls for ``reset_gpu`` is reported in ``resettable_gpus`` meanwhile.
- Commands to the node arrive on ``cmd._.<node>`` (durable consumer
  ``monitor-<node>``, new messages only): InjectGpuError raises an XID on a simulated
  GPU, or makes its readings show a warning sign; RepairNode (``resurge node
  uncordon``: the operator's word that the node was repaired) makes every simulated GPU
  healthy again, without warning signs, and reports the node at once. Both are
  ignored, with a log line, on NVML GPUs. ResetGpu (the restarter's, between stopping a
  job's workers and starting them again) resets the GPUs it names, real or simulated,
  answers each with a GpuReset on ``raw._.gpu_reset.<node>`` and reports the node at
  once (:mod:`~resurge_node_agent.monitor.gpu_reset`). CheckNode (the restarter's, for a
  quarantined node) checks the node's health and answers with a NodeChecked on
  ``raw._.node_checked.<node>`` (:mod:`~resurge_node_agent.monitor.health_check`).
- Where the backend leaves it to the monitors (local; on Kubernetes the kubelet runs
  the groups' pods), watches the cluster backend for the worker groups placed on this
  node, and reconciles them as a kubelet reconciles pods: a new group starts a
  ``resurge-node-agent launch`` process, handed the group's spec whole in
  ``RESURGE_WORKER_GROUP``; a bumped ``incarnation`` recreates it, a deleted group
  stops it. A launch agent that exits non-zero while its group still exists is started
  again (restartPolicy OnFailure).

Its events go out through an :class:`~resurge.runtime.outbox.Outbox`: while NATS is
down they wait, in order, to be sent once it is back (a full outbox drops the oldest
node reports and GPU samples first, never a GPU error or a lost agent).

It acts on the cluster only through :class:`~resurge.cluster.protocol.ClusterBackend`
(:func:`resurge.cluster.open_backend`, chosen by ``RESURGE_CLUSTER``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Literal

from resurge.cluster import open_backend
from resurge.cluster.protocol import ClusterBackend, ClusterChange, NodeInfo, WorkerGroupSpec
from resurge.contract.subjects import NODE_LEVEL_JOB, escape_token
from resurge.contract.subscriptions import MONITOR_COMMANDS, Scope
from resurge.events import (
    AgentState,
    AgentStateChanged,
    CheckNode,
    GpuError,
    GpuSample,
    InjectGpuError,
    NodeReport,
    RepairNode,
    ResetGpu,
)
from resurge.runtime.bus import PermanentError
from resurge.runtime.outbox import Outbox
from resurge.runtime.service import ServiceContext
from resurge_node_agent.launch.group_spec import spec_environment
from resurge_node_agent.monitor.gpu_reset import reset_gpus
from resurge_node_agent.monitor.gpus import (
    GpuErrorReport,
    GpuSource,
    SimulatedGpus,
    monitoring,
    select_gpus,
)
from resurge_node_agent.monitor.health_check import check_node
from resurge_node_agent.monitor.job_credentials import launch_credentials

__all__ = ["MonitorConfig", "NodeMonitor"]

HEARTBEAT_SECONDS = 3.0
_RESTART_BACKOFF_SECONDS = 1.0


# A worker group on this node: (job, replica).
GroupKey = tuple[str, int]


@dataclass(frozen=True)
class MonitorConfig:
    """The node's own settings: its name, slots, address, where agents' output goes, and
    its labels."""

    node: str
    slots: int | None  # --gpus; None: the GPUs NVML finds
    address: str
    log_dir: Path | None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class _Running:
    """A launch agent this monitor started for a worker group."""

    spec: WorkerGroupSpec
    process: asyncio.subprocess.Process
    stopping: bool = False


class NodeMonitor:
    """One node's monitor agent (see the module docstring)."""

    def __init__(
        self, ctx: ServiceContext, config: MonitorConfig, gpus: GpuSource | None = None
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.groups: dict[GroupKey, _Running] = {}
        self.backend: ClusterBackend | None = None
        self.gpus = gpus
        self._gpu_errors: asyncio.Queue[GpuErrorReport] = asyncio.Queue()
        self._reporting = asyncio.Lock()
        self.outbox = Outbox(ctx.bus, ctx.registry)

    @property
    def slots(self) -> int:
        """The slots the node offers: ``--gpus``, else its GPUs."""
        if self.config.slots is not None:
            return self.config.slots
        return 0 if self.gpus is None else self.gpus.count

    @property
    def gpu_monitoring(self) -> Literal["nvml", "simulated", "none"] | None:
        """How the GPUs are watched (None before they are opened)."""
        return None if self.gpus is None else monitoring(self.gpus)

    @property
    def free_slots(self) -> int:
        """Slots no running worker group takes."""
        used = sum(r.spec.nproc for r in self.groups.values() if not r.stopping)
        return max(0, self.slots - used)

    @property
    def unhealthy_gpus(self) -> list[int]:
        """Indexes of the GPUs that are unhealthy now."""
        return [] if self.gpus is None else self.gpus.unhealthy()

    @property
    def resettable_gpus(self) -> list[int]:
        """Of those, the ones a reset may bring back, where the cluster resets GPUs."""
        if self.gpus is None or not self.ctx.settings.gpu_reset:
            return []
        return self.gpus.resettable()

    async def start(self) -> None:
        """Open the backend and the GPUs, report the node, then reconcile and beat."""
        bus = self.ctx.bus
        self.backend = await open_backend(bus, self.ctx.settings)
        # Not a task of the context's: it outlives them, to send what the shutdown says.
        self.outbox.start()
        self.ctx.exit_stack.push_async_callback(self.outbox.close)
        self.ctx.exit_stack.push_async_callback(self._shutdown)
        if self.gpus is None:
            self.gpus = await asyncio.to_thread(
                select_gpus, self.config.slots or 0, self.config.node
            )
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
        self.ctx.spawn(self._publish_gpu_errors, name="publish_gpu_errors")
        # Bound before the first report, so a NodeReport seen means commands are heard.
        await bus.bind(MONITOR_COMMANDS, self._on_command, Scope(node=self.config.node))
        await self._report()
        if self.backend.launches_worker_groups:  # else the cluster runs them (pods)
            self.ctx.spawn(self._follow_worker_groups, name="reconcile")
        self.ctx.spawn(self._heartbeat, name="heartbeat")

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
            slots=self.slots,
            healthy=healthy,
            address=self.config.address,
            labels=self.config.labels,
            heartbeat=datetime.now(UTC),
            gpu_monitoring=self.gpu_monitoring,
        )
        await self.backend.report_node(info)
        free = self.free_slots
        report = NodeReport(
            source=bus.source,
            node=node,
            slots_total=self.slots,
            slots_free=free,
            healthy=healthy,
            unhealthy_gpus=unhealthy,
            resettable_gpus=self.resettable_gpus,
            labels=self.config.labels,
        )
        self.outbox.put(bus.subjects.raw(NODE_LEVEL_JOB, "node_report", node), report)
        if readings:
            sample = GpuSample(
                source=bus.source,
                node=node,
                gpus=readings,
                simulated=bool(self.gpus is not None and self.gpus.simulated),
            )
            self.outbox.put(bus.subjects.raw(NODE_LEVEL_JOB, "gpu_sample", node), sample)

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
            self.ctx.log.warning(
                "GPU %d error (%s): %s",
                report.gpu,
                report.error,
                report.message,
                extra={"node": node},
            )
            # Sent until the stream has it (the outbox retries with the same event id).
            self.outbox.put(bus.subjects.raw(NODE_LEVEL_JOB, "gpu_error", node), event)
            if report.gpu in self.unhealthy_gpus:
                try:
                    await self._report()  # tell the cluster now, not at the next beat
                except Exception:
                    self.ctx.log.exception("could not report node %s", node)

    async def _on_command(self, event: InjectGpuError | RepairNode | ResetGpu | CheckNode) -> None:
        gpus = self.gpus
        if isinstance(event, ResetGpu):
            if gpus is not None:
                await self._reset(event, gpus)
            return
        if isinstance(event, CheckNode):
            if gpus is not None:
                await self._check(event, gpus)
            return
        if not isinstance(gpus, SimulatedGpus):
            self.ctx.log.warning(
                "ignoring %s: this node's GPUs are real (NVML)",
                "a repair" if isinstance(event, RepairNode) else _injected(event),
                extra={"event_id": event.id},
            )
            return
        if isinstance(event, RepairNode):
            repaired = gpus.repair()
            self.ctx.log.info(
                "node repaired: simulated GPU(s) %s healthy again",
                ", ".join(map(str, repaired)) or "(none were unhealthy)",
                extra={"event_id": event.id},
            )
            await self._report()  # the cluster sees the capacity now, not at the next beat
            return
        try:
            if event.warning is not None:
                gpus.inject_warning(event.gpu, event.warning)
            elif event.xid is not None:
                gpus.inject_xid(event.gpu, event.xid)
        except IndexError as error:
            raise PermanentError(f"node {self.config.node}: {error}") from None
        self.ctx.log.info(
            "%s into simulated GPU %d", _injected(event), event.gpu, extra={"event_id": event.id}
        )

    async def _reset(self, command: ResetGpu, gpus: GpuSource) -> None:
        """Reset the GPUs ``command`` names, answer each, and report the node at once."""
        bus, node, settings = self.ctx.bus, self.config.node, self.ctx.settings
        answers = await reset_gpus(
            command,
            gpus,
            source=bus.source,
            node=node,
            reset_command=settings.gpu_reset_command,
            bound=settings.gpu_reset_timeout_seconds,
        )
        for one in answers:
            if one.failure is not None:
                self._gpu_errors.put_nowait(one.failure)
            self.ctx.log.log(
                logging.INFO if one.answer.ok else logging.WARNING,
                "GPU reset for job %s (%s): %s",
                command.job,
                command.reason or "asked",
                one.answer.message,
                extra={"node": node, "event_id": command.id},
            )
            self.outbox.put(bus.subjects.raw(NODE_LEVEL_JOB, "gpu_reset", node), one.answer)
        await self._report()  # the cluster sees the GPUs healthy now, not at the next beat

    async def _check(self, command: CheckNode, gpus: GpuSource) -> None:
        """Check the node's health, answer, and report the node at once."""
        bus, node, settings = self.ctx.bus, self.config.node, self.ctx.settings
        answer = await check_node(
            command,
            gpus,
            source=bus.source,
            node=node,
            reset_command=settings.gpu_reset_command,
            reset_bound=settings.gpu_reset_timeout_seconds,
            check_command=settings.node_health_check_command,
            check_bound=settings.node_health_check_timeout_seconds,
        )
        self.ctx.log.log(
            logging.INFO if answer.passed else logging.WARNING,
            "health check %s: %s",
            "passed" if answer.passed else "failed",
            answer.message,
            extra={"node": node, "event_id": command.id},
        )
        self.outbox.put(bus.subjects.raw(NODE_LEVEL_JOB, "node_checked", node), answer)
        await self._report()

    async def _follow_worker_groups(self) -> None:
        backend = self.backend
        assert backend is not None
        if backend.launches_worker_groups:  # else the cluster runs them (pods)
            await self._reconcile(backend.watch(node=self.config.node))

    async def _reconcile(self, changes: AsyncIterator[ClusterChange]) -> None:
        async for change in changes:
            if _cancelled():
                raise asyncio.CancelledError  # see _cancelled
            if change.kind != "worker_group" or change.job is None or change.replica is None:
                continue  # node changes: this monitor writes its own node
            key = (change.job, change.replica)
            try:
                if change.deleted:
                    await self._remove(key)
                elif change.worker_group is not None:
                    await self._apply(key, change.worker_group)
            except Exception:
                self.ctx.log.exception("could not reconcile worker group %s", _name(key))
            try:
                await self._report()
            except Exception:  # a missed report, not a dead watch
                self.ctx.log.exception("could not report node %s", self.config.node)

    async def _apply(self, key: GroupKey, spec: WorkerGroupSpec) -> None:
        running = self.groups.get(key)
        unchanged = running is not None and running.spec.incarnation == spec.incarnation
        if unchanged and running is not None and running.process.returncode is None:
            return
        if running is not None:
            await self._remove(key)
        await self._launch(key, spec)

    async def _launch(self, key: GroupKey, spec: WorkerGroupSpec) -> None:
        argv = [sys.executable, "-m", "resurge_node_agent", "launch"]
        output = self._log_file(spec)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env={
                    **os.environ,
                    **spec_environment(spec),
                    **await launch_credentials(os.environ, self.config.node, spec.job),
                },
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
            _name(key),
            process.pid,
            spec.incarnation,
            extra={"job": spec.job, "replica": spec.replica},
        )
        self.ctx.spawn(self._watch(key, spec, process), name="watch_worker_group")

    def _log_file(self, spec: WorkerGroupSpec) -> IO[bytes] | None:
        if self.config.log_dir is None:
            return None
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        name = f"agent-{escape_token(spec.job)}-{spec.replica}.log"
        return (self.config.log_dir / name).open("ab")

    async def _watch(
        self, key: GroupKey, spec: WorkerGroupSpec, process: asyncio.subprocess.Process
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
            "worker group %s exited with %d; starting it again",
            _name(key),
            code,
            extra={"job": spec.job, "replica": spec.replica},
        )
        # Its workers died with it: say so, so the job gets a new generation at once.
        lost = AgentStateChanged(
            source=self.ctx.bus.source,
            job=spec.job,
            replica=spec.replica,
            node=self.config.node,
            state=AgentState.LOST,
            detail=f"the agent (pid {process.pid}, incarnation {spec.incarnation}) exited "
            f"with {code} without being stopped",
        )
        self.outbox.put(self.ctx.bus.subjects.raw(spec.job, lost.kind, self.config.node), lost)
        await asyncio.sleep(_RESTART_BACKOFF_SECONDS)
        if self.groups.get(key) is running:
            await self._launch(key, spec)

    async def _remove(self, key: GroupKey) -> None:
        running = self.groups.get(key)
        if running is None:
            return
        running.stopping = True
        await _terminate(running.process, running.spec.stop_grace_seconds + 5)
        if self.groups.get(key) is running:
            self.groups.pop(key)

    async def _shutdown(self) -> None:
        await asyncio.gather(*(self._remove(key) for key in list(self.groups)))


def _cancelled() -> bool:
    """Whether this task was cancelled, though no CancelledError reached it.

    On Python 3.11 ``asyncio.wait_for`` (inside nats.py's requests) drops a cancel that
    comes as its reply arrives; the watch reads the node's record with such requests
    after each heartbeat, and would then wait for the next change with the cancel lost,
    keeping a stopping monitor alive.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _name(key: GroupKey) -> str:
    """A worker group as logs name it: ``job/replica``."""
    return f"{key[0]}/{key[1]}"


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


def _injected(event: InjectGpuError) -> str:
    """What ``event`` injects, in words."""
    if event.warning is not None:
        return f"injected warning sign {event.warning}"
    return f"injected XID {event.xid}"
