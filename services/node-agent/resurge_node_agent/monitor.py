"""``monitor`` mode: one per node. Reports the node and runs the worker groups placed on it.

- Writes the node's record (slots, health, address, heartbeat) to the ``nodes`` bucket
  every few seconds and publishes CapacityChanged whenever its free slots change.
- Watches the ``workergroups`` bucket for keys under this node, and reconciles them as a
  kubelet reconciles pods: a new key starts a ``resurge-node-agent launch`` process, a
  bumped ``incarnation`` recreates it, a deleted key stops it. A launch agent that exits
  non-zero while its key still exists is started again (restartPolicy OnFailure).
- In local mode the node's GPUs are simulated slots; NVML health comes with issue 4.
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
from resurge.events import CapacityChanged
from resurge.service import ServiceContext
from resurge.subjects import escape_token

__all__ = ["MonitorConfig", "NodeMonitor"]

HEARTBEAT_SECONDS = 3.0
_RESTART_BACKOFF_SECONDS = 1.0


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
    def __init__(self, ctx: ServiceContext, config: MonitorConfig) -> None:
        self.ctx = ctx
        self.config = config
        self.groups: dict[str, _Running] = {}
        self.backend: LocalBackend | None = None
        self._last_free: int | None = None

    @property
    def free_slots(self) -> int:
        used = sum(r.spec.nproc for r in self.groups.values() if not r.stopping)
        return max(0, self.config.slots - used)

    async def start(self) -> None:
        self.backend = await LocalBackend.open(self.ctx.bus)
        self.ctx.exit_stack.push_async_callback(self._shutdown)
        await self._report()
        watcher = await self.backend.groups.watch(f"{escape_token(self.config.node)}.>")
        self.ctx.spawn(self._reconcile(watcher))
        self.ctx.spawn(self._heartbeat())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            await self._report()

    async def _report(self) -> None:
        assert self.backend is not None
        info = NodeInfo(
            name=self.config.node,
            slots=self.config.slots,
            address=self.config.address,
            heartbeat=datetime.now(UTC),
        )
        await self.backend.put_node(info)
        free = self.free_slots
        if free != self._last_free:
            self._last_free = free
            bus = self.ctx.bus
            event = CapacityChanged(
                source=bus.source,
                node=self.config.node,
                slots_total=self.config.slots,
                slots_free=free,
                healthy=True,
            )
            await bus.publish(bus.subjects.capacity(self.config.node), event)

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
