"""Per-service metrics registry and the ``/metrics``, ``/livez`` and ``/readyz`` endpoint.

The server runs in a daemon thread (prometheus-client's exposition is synchronous).
Each health path answers 200 ``ok`` while its callback returns no lines, 503 with one
line per problem otherwise:

- ``/livez`` (the Kubernetes liveness probe: a failing pod is restarted) asks ``live``:
  only what a restart of the process can cure (a background loop dead or
  crash-looping), never what lies outside it, such as the NATS server.
- ``/readyz`` (the readiness probe: a failing pod only leaves Service endpoints) asks
  ``ready``: whatever keeps the service from working now, the bus being down included.
- ``/healthz`` answers as ``/readyz``, for probes and tools written before the split.

:class:`BoundedLabel` keeps a label whose values come from outside the code (a fault's
reason: detector plugins choose their own) bounded: the first ``limit`` values pass
through, every later new value is counted under ``other``. docs/metrics.md lists every
metric and its labels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["OTHER", "BoundedLabel", "MetricsServer", "Problems"]

OTHER = "other"
"""The value a :class:`BoundedLabel` gives every value past its limit."""


class BoundedLabel:
    """Label values from an open set, bounded: the first ``limit`` distinct values (each
    cut to ``max_chars``) pass through, any later new one becomes :data:`OTHER`."""

    def __init__(self, limit: int = 32, max_chars: int = 64) -> None:
        self.limit = limit
        self.max_chars = max_chars
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        """The label value to use for ``value``."""
        value = value[: self.max_chars]
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER


Problems = Callable[[], list[str]]
"""What is wrong now, one line each; empty while all is well."""


class MetricsServer:
    """Serves ``/metrics`` from ``registry``, ``/livez`` from ``live`` and ``/readyz``
    (and ``/healthz``) from ``ready``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        live: Problems,
        ready: Problems,
        host: str,
        port: int,
    ) -> None:
        registry_ = registry
        checks = {"/livez": (live, "unhealthy"), "/readyz": (ready, "unready")}
        checks["/healthz"] = checks["/readyz"]

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(registry_), CONTENT_TYPE_LATEST)
                elif path in checks:
                    problems, word = checks[path]
                    found = problems()
                    if found:
                        body = "".join(f"{word}: {line}\n" for line in found)
                        self._reply(503, body.encode())
                    else:
                        self._reply(200, b"ok\n")
                else:
                    self._reply(404, b"not found: try /metrics, /livez or /readyz\n")

            def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        """The port it listens on (the one picked when asked for 0)."""
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        """Start serving in a daemon thread; returns itself."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
