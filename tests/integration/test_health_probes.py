"""A NATS outage restarts nothing: liveness is a service's own loops, readiness adds NATS.

Four real service processes (detector, restarter, scaler, node monitor) against a real
nats-server, probed on the paths their Kubernetes manifests (deploy/base/services/) give
the kubelet. They run with the local cluster backend: the health endpoints are the
service runner's, the same with either backend. The server is SIGKILLed: every service
turns unready, and stays live, probed every second, for longer than the kubelet takes to
kill a pod whose liveness probe fails (failureThreshold x periodSeconds, from the
manifests); once the server is back on its port, every service is ready again by itself.
Liveness and readiness as Kubernetes defines them:
https://kubernetes.io/docs/concepts/configuration/liveness-readiness-startup-probes/
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from resurge.local.nats_server import NatsServer, free_port
from tests.http_get import get

REPO = Path(__file__).resolve().parents[2]
SERVICES = {
    "detector": ["-m", "resurge_detector"],
    "restarter": ["-m", "resurge_restarter"],
    "scaler": ["-m", "resurge_scaler"],
    "node-monitor": ["-m", "resurge_node_agent", "monitor", "--node", "n1", "--gpus", "2"],
}


@dataclass(frozen=True)
class Probe:
    path: str
    period: float
    failures: int


def probes(service: str) -> tuple[Probe, Probe]:
    """The liveness and readiness probes of the service's container in its manifest."""
    manifest = REPO / "deploy" / "base" / "services" / f"{service}.yaml"
    docs = [doc for doc in yaml.safe_load_all(manifest.read_text()) if doc]
    (workload,) = [doc for doc in docs if doc["kind"] != "Service"]
    (container,) = workload["spec"]["template"]["spec"]["containers"]

    def probe(spec: dict[str, Any]) -> Probe:
        # Kubernetes' defaults: periodSeconds 10, failureThreshold 3.
        return Probe(spec["httpGet"]["path"], spec.get("periodSeconds", 10),
                     spec.get("failureThreshold", 3))  # fmt: skip

    return probe(container["livenessProbe"]), probe(container["readinessProbe"])


@dataclass
class Service:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    live: Probe
    ready: Probe
    log: Path

    def probe(self, probe: Probe) -> tuple[int, str]:
        if self.process.poll() is not None:
            tail = "".join(self.log.read_text().splitlines(keepends=True)[-20:])
            raise AssertionError(f"{self.name} exited {self.process.returncode}:\n{tail}")
        return get(f"http://127.0.0.1:{self.port}{probe.path}")

    def answers(self, probe: Probe, status: int) -> Callable[[], bool]:
        return lambda: self.probe(probe)[0] == status


def start(name: str, server: NatsServer, namespace: str, logs: Path) -> Service:
    port = free_port()
    env = {
        **os.environ,
        "RESURGE_NATS_URL": server.url,
        "RESURGE_NAMESPACE": namespace,
        "RESURGE_METRICS_PORT": str(port),
        "RESURGE_LOG_FORMAT": "text",
    }
    log = logs / f"{name}.log"
    with log.open("wb") as out:  # a file: never a full pipe
        process = subprocess.Popen([sys.executable, *SERVICES[name]], env=env, stderr=out)
    return Service(name, port, process, *probes(name), log)


def until(test: Callable[[], bool], what: str, seconds: float = 90.0) -> None:
    """Wait for a state reached by other processes."""
    deadline = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline, f"not within {seconds:g} s: {what}"
        time.sleep(0.2)  # the state polled lives in other processes


@pytest.fixture
def services(namespace: str, tmp_path: Path) -> Iterator[tuple[NatsServer, list[Service]]]:
    with ExitStack() as stack:
        server = NatsServer(tmp_path / "nats").start()
        stack.callback(server.stop)
        running = []
        for name in SERVICES:
            service = start(name, server, namespace, tmp_path)
            stack.callback(service.process.wait)
            stack.callback(service.process.kill)
            running.append(service)
        yield server, running
        for service in running:
            service.process.send_signal(signal.SIGTERM)
        for service in running:
            code = service.process.wait(timeout=30)
            assert code == 0, f"{service.name} exited {code}:\n{service.log.read_text()[-2000:]}"


def test_a_nats_outage_makes_services_unready_and_kills_none(
    services: tuple[NatsServer, list[Service]],
) -> None:
    server, running = services
    for service in running:
        until(service.answers(service.ready, 200), f"{service.name} ready")
        assert service.probe(service.live) == (200, "ok\n")

    assert server.process is not None and server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    server.process.wait()
    for service in running:
        until(service.answers(service.ready, 503), f"{service.name} unready")
        status, body = service.probe(service.ready)
        assert status == 503 and "not connected to nats" in body, (service.name, body)

    # As long as the kubelet takes to kill a pod, probing more often than it does.
    window = max(s.live.period * s.live.failures for s in running)
    period = min(s.live.period for s in running)
    started = time.monotonic()
    while time.monotonic() - started < window + period:
        for service in running:
            assert service.probe(service.live) == (200, "ok\n"), service.name
            assert service.probe(service.ready)[0] == 503, service.name
        time.sleep(1.0)  # the outage's length is what is tested

    server.start()  # same port, same data folder
    for service in running:
        until(service.answers(service.ready, 200), f"{service.name} back")
        assert service.probe(service.live) == (200, "ok\n")
