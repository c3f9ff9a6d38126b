"""A supervisor that is stopping starts nothing again, even from a check that runs in
another thread meanwhile (the story runner checks in a thread): a child or a NATS
server that exits during the stop stays down, so nothing outlives the cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from resurge.local.supervisor import Supervisor, _Child


def test_a_child_that_died_is_not_started_again_once_stopping(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path, nats_url="nats://127.0.0.1:4222")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    supervisor.children["scaler"] = _Child("scaler", [sys.executable, "-c", "pass"], process=dead)
    supervisor.stop(grace=1)
    for _ in range(3):  # past any backoff: the first check only schedules the restart
        assert supervisor.check() is False
    assert supervisor.children["scaler"].process is dead, "nothing was started again"
    assert supervisor.children["scaler"].restarts == 0
