"""The ``resurge`` CLI against a local cluster in a test's state folder, for end-to-end
tests that drive only the public contract, and a bounded poll of another process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def resurge(state_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``resurge --state-dir STATE_DIR ARGS...`` from the repository, with none of the
    test process's ``RESURGE_*`` settings; its output captured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESURGE_")}
    return subprocess.run(
        [str(BIN / "resurge"), "--state-dir", str(state_dir), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO,
    )  # fmt: skip


def wait_until(test: Callable[[], object], seconds: float = 120, every: float = 0.2) -> None:
    """Until ``test()`` holds, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)  # another process's progress: polled, bounded
