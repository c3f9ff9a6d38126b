"""resurge's services and node agents as child processes on this machine.

:class:`LocalCluster` starts each service with ``python -m <package>`` (so it needs no
import of any service), points them at one NATS URL and namespace, and writes each
one's output to ``<state_dir>/logs/<name>.log``. Node agents are started per replica.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SERVICE_MODULES", "LocalCluster"]

SERVICE_MODULES = {
    "detector": "resurge_detector",
    "restarter": "resurge_restarter",
    "scaler": "resurge_scaler",
}


@dataclass
class LocalCluster:
    state_dir: Path
    nats_url: str
    namespace: str = "resurge"
    nodes: Sequence[str] = ("node-0",)
    cwd: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        # Workers that run `python ...` get the interpreter this cluster runs on.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        return {
            **os.environ,
            "PATH": path,
            "RESURGE_NATS_URL": self.nats_url,
            "RESURGE_NAMESPACE": self.namespace,
            "RESURGE_NODES": ",".join(self.nodes),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        path = self.log_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.cwd,
                start_new_session=True,
            )
        self.processes[name] = proc
        return proc

    def start_services(self) -> None:
        for name, module in SERVICE_MODULES.items():
            self._spawn(name, [sys.executable, "-m", module])

    def start_agent(
        self,
        job: str,
        replica: int,
        nproc_per_node: int,
        command: Sequence[str],
        node: str | None = None,
        stop_grace_seconds: float = 5.0,
        working_dir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        node = node or self.nodes[replica % len(self.nodes)]
        argv = [
            sys.executable,
            "-m",
            "resurge_node_agent",
            "launch",
            "--job",
            job,
            "--replica",
            str(replica),
            "--nproc-per-node",
            str(nproc_per_node),
            "--node",
            node,
            "--stop-grace-seconds",
            str(stop_grace_seconds),
            *(["--working-dir", working_dir] if working_dir else []),
            *(f"--env={name}={value}" for name, value in (env or {}).items()),
            "--",
            *command,
        ]
        return self._spawn(f"agent-{job}-{replica}", argv)

    def wait_agents(self, timeout: float) -> dict[str, int | None]:
        """Wait for every agent to exit; their exit codes (None: still running)."""
        codes: dict[str, int | None] = {}
        for name, proc in self.processes.items():
            if name.startswith("agent-"):
                try:
                    codes[name] = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    codes[name] = None
        return codes

    def alive(self) -> dict[str, bool]:
        return {name: proc.poll() is None for name, proc in self.processes.items()}

    def stop(self, timeout: float = 10.0) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
