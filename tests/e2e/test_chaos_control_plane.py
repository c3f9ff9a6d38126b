"""Three minutes of ``bench/chaos.py --control-plane`` break no invariant.

The bench (bench/chaos_control_plane.py) runs the local cluster with two restarters and
two scalers, each service and node monitor behind a TCP proxy it partitions, delays
and resets, streams that refuse publishes for a while, the detector SIGKILLed during a
hang, the services' wall clock stepped, and today's worker-side faults; its judge
checks four invariants twice a second and prints each one broken. The seed is drawn
here and named in the failure, so the run can be repeated.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(480)
def test_three_minutes_of_control_plane_chaos_break_no_invariant() -> None:
    seed = random.SystemRandom().randrange(1_000_000)
    command = [sys.executable, "bench/chaos.py", "--control-plane", "--minutes", "3"]
    run = subprocess.run(
        [*command, "--seed", str(seed)],
        cwd=REPO, capture_output=True, text=True, timeout=450, check=False,
    )  # fmt: skip
    said = f"seed {seed}; stdout:\n{run.stdout[-8000:]}\nstderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, said
    samples = re.search(r"judged (\d+) samples", run.stdout)
    injected = re.search(r"faults injected into the trainer: (\d+)", run.stdout)
    assert samples and int(samples.group(1)) > 100, said
    assert injected and int(injected.group(1)) >= 1, said
    assert "invariants broken: 0\n" in run.stdout, said
