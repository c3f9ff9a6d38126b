"""A service process: JSON logs, /metrics, /livez and /readyz, SIGTERM drains and exits 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from urllib.parse import urlparse

import pytest

from resurge.runtime.settings import Settings
from tests.http_get import get
from tests.integration.blackhole_proxy import proxy_in_thread


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
    """What a stuck service is doing, without stopping it: its threads' stacks and its
    asyncio tasks' on stderr."""
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
        # then, from the event loop, where each task waits (an idle loop's threads show
        # only its select())
        tasks: list[str] = []
        for line in proc.stderr:
            tasks.append(line)
            seen = "".join(tasks)
            supervised_at = [i for i, t in enumerate(tasks) if t.rstrip().endswith("in _supervise")]
            # read on to the line under the first supervisor's frame (checked below): the
            # dump can arrive in pieces, and stopping right at that frame left it unread
            whole = bool(supervised_at) and len(tasks) > supervised_at[0] + 1
            if ("in _serve" in seen and whole) or len(tasks) > 400:
                break
        assert any(line.endswith("asyncio tasks:\n") for line in tasks), tasks
        # each task's whole await chain, not only its outermost frame: a supervised loop
        # shows the loop it runs under its supervisor
        chain = [line.strip() for line in tasks]
        supervised = [i for i, line in enumerate(chain) if line.endswith("in _supervise")]
        assert supervised and chain[supervised[0] + 1].startswith("/"), tasks
        assert get(f"http://127.0.0.1:{port}/livez") == (200, "ok\n")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()


# A service whose setup makes its stop meet a broken connection (the reset a real NATS
# outage or proxy gives at that moment, raised where the exit stack unwinds), or whose
# start meets one; run through the real runner on the test's NATS.
_BREAKING_SERVICE = """
import sys
from resurge.runtime.service import run_service
from resurge.runtime.settings import Settings

async def setup(ctx):
    async def reset():
        raise ConnectionResetError(104, "Connection reset by peer")
    ctx.exit_stack.push_async_callback(reset)
    if sys.argv[1] == "start":
        raise ConnectionRefusedError(111, "Connection refused")
    ctx.stopping.set()

sys.exit(run_service("breaking", Settings(), setup))
"""


@pytest.mark.parametrize(("when", "code"), [("stop", 0), ("start", 2)])
def test_exit_2_means_the_service_could_not_start_not_that_its_stop_met_a_reset(
    settings: Settings, when: str, code: int
) -> None:
    """Seen in CI: a scaler stopped by SIGTERM right after a NATS outage exited 2 on
    "[Errno 104] Connection reset by peer" raised while it stopped."""
    env = {
        **os.environ,
        "RESURGE_NATS_URL": settings.nats_url,
        "RESURGE_NAMESPACE": settings.namespace,
    }
    done = subprocess.run(
        [sys.executable, "-c", _BREAKING_SERVICE, when],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    if when == "stop":
        assert "breaking ready" in done.stderr
        assert "connection broke while stopping" in done.stderr
        assert "ConnectionResetError" in done.stderr  # with its traceback, for whoever reads why


def test_a_service_whose_connection_is_reset_while_it_drains_exits_0(settings: Settings) -> None:
    """A real service, its NATS connection reset by a proxy at the first UNSUB of its
    drain (the moment SIGTERM's drain starts), stops cleanly."""
    server = urlparse(settings.nats_url.split(",")[0])
    assert server.hostname is not None and server.port is not None
    with proxy_in_thread((server.hostname, server.port)) as proxy:
        port = free_port()
        proc = start(settings.model_copy(update={"nats_url": proxy.url}), "resurge_detector", port)
        try:
            read_json_logs_until(proc, "detector ready")
            proxy.reset_on(b"UNSUB")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
            assert proxy.resets == 1
        finally:
            proc.kill()
            proc.wait()
