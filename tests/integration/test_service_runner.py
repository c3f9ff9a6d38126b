"""A service process: JSON logs, /metrics, /livez and /readyz, SIGTERM drains and exits 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from resurge.runtime.settings import Settings
from tests.http_get import get


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(settings: Settings, module: str, port: int) -> subprocess.Popen[str]:
    """``python -m module`` on the test's NATS, serving /metrics and the probes on
    ``port``, its stderr (JSON logs) piped."""
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
        "RESURGE_METRICS_PORT": str(port),
    }
    return subprocess.Popen(
        [sys.executable, "-m", module], env=env, stderr=subprocess.PIPE, text=True
    )


def read_json_logs_until(proc: subprocess.Popen[str], message_part: str) -> list[dict[str, object]]:
    assert proc.stderr is not None
    entries = []
    for line in proc.stderr:
        entries.append(json.loads(line))
        if message_part in str(entries[-1]["message"]):
            return entries
    raise AssertionError(f"service exited before logging {message_part!r}: {entries}")


def test_service_serves_metrics_and_health_logs_json_and_stops_on_sigterm(
    settings: Settings,
) -> None:
    port = free_port()
    proc = start(settings, "resurge_detector", port)
    try:
        logs = read_json_logs_until(proc, "detector ready")
        assert all(entry["service"] == "detector" for entry in logs)
        assert any(f"port {port}" in str(entry["message"]) for entry in logs)

        for path in ("/livez", "/readyz", "/healthz"):  # /healthz: /readyz's former name
            assert get(f"http://127.0.0.1:{port}{path}") == (200, "ok\n"), path
        status, body = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert 'resurge_dead_letters_total{reason="not_json"} 0.0' in body
        assert get(f"http://127.0.0.1:{port}/nope")[0] == 404

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("service", ["scaler", "restarter"])
def test_a_service_whose_loops_all_run_is_healthy(settings: Settings, service: str) -> None:
    """Each background loop is supervised, and none ends by design (the local backend's
    reconciliation among them): a loop that ended would make /livez 503."""
    port = free_port()
    proc = start(settings, f"resurge_{service}", port)
    try:
        read_json_logs_until(proc, f"{service} ready")
        assert get(f"http://127.0.0.1:{port}/livez") == (200, "ok\n")
        assert get(f"http://127.0.0.1:{port}/readyz") == (200, "ok\n")
        assert (
            "# TYPE resurge_task_restarts_total counter"
            in get(f"http://127.0.0.1:{port}/metrics")[1]
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


def test_sigquit_prints_every_threads_stack_and_the_service_runs_on(settings: Settings) -> None:
    """What a stuck service is doing, without stopping it: its stacks on stderr."""
    port = free_port()
    proc = start(settings, "resurge_detector", port)
    try:
        read_json_logs_until(proc, "detector ready")
        proc.send_signal(signal.SIGQUIT)
        assert proc.stderr is not None
        dump = []
        for line in proc.stderr:  # faulthandler's plain text, between the JSON log lines
            dump.append(line)
            if line.rstrip().endswith(" in run_service"):  # the main thread's outermost frame
                break
        assert any(line.startswith(("Current thread", "Thread 0x")) for line in dump), dump
        assert get(f"http://127.0.0.1:{port}/livez") == (200, "ok\n")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
