"""The live `resurge status` table on a terminal while the cluster goes away.

`resurge status` runs on a pseudo-terminal (so it refreshes live, as in a user's shell)
while `resurge down` stops the cluster from another "shell": it says the cluster went
away and exits, with no traceback and no raw NATS error lines.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from resurge.local.job_factory import job
from tests.e2e.test_local_cluster import BIN, REPO, resurge, wait_until

pytestmark = pytest.mark.e2e

PLAIN = "import time\nwhile True:\n    time.sleep(0.5)\n"


class Terminal:
    """A command on a pseudo-terminal, its output gathered as it comes."""

    def __init__(self, *argv: str) -> None:
        self.master, slave = pty.openpty()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESURGE_")}
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO, close_fds=True
        )
        os.close(slave)
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the command's side is closed
                return
            if not chunk:
                return
            self.chunks.append(chunk)

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.reader.join(10)
        os.close(self.master)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    result = resurge(state, "up", "--nodes", "1", "--gpus-per-node", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield state
    finally:
        resurge(state, "down")


def test_live_status_says_the_cluster_went_away_and_exits_cleanly(
    state_dir: Path, tmp_path: Path
) -> None:
    spec = job("plain", [sys.executable, "-c", PLAIN])
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_none=True)))
    assert resurge(state_dir, "submit", str(path)).returncode == 0
    terminal = Terminal(str(BIN / "resurge"), "--state-dir", str(state_dir), "status")
    try:
        wait_until(lambda: "plain" in terminal.text and "Running" in terminal.text, 60)
        assert terminal.process.poll() is None  # live: it refreshes until stopped

        down = resurge(state_dir, "down")
        assert down.returncode == 0, down.stderr
        code = terminal.process.wait(timeout=60)
        terminal.reader.join(10)
        text = terminal.text
        assert "Traceback" not in text and "nats error" not in text, text
        assert code == 1 and "the cluster went away" in text, text
    finally:
        terminal.close()
