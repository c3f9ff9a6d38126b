"""No false positive: healthy workers on a loaded machine raise no fault for a minute.

Both cores are kept busy by two other processes; every built-in detector is on with
settings a user would pick (heartbeat and startup timeouts, a log rule expecting a
line at least every 10 s, straggler detection on progress intervals). Set
RESURGE_SOAK_SECONDS to run shorter or longer (default 60).

Why a minute is enough: every judgement that could go wrong here runs on a window of
at most 15 s (a rank's 10 s heartbeat timeout, the log rule's 10 s recurrence, the
node monitors' 15 s silence, straggler windows of 20 steps of 0.1 s), so 60 s of
steady training puts each of them to the test at least four times over, on all four
ranks and both nodes (some 30 straggler windows per rank), besides the start-up (the
60 s startup timeout and the log rule's first line). A longer soak only
repeats the same checks; run one with RESURGE_SOAK_SECONDS=300 when changing the
detectors' timing.

Run alone, the two busy loops compete with the workers at the same priority. Under
``pytest -n 2`` the rest of the suite runs beside it in another pytest-xdist worker
(whole local clusters, torch imports, DDP training: real contention), so the loops run
at the lowest priority there: they still keep both cores busy whenever the suite
leaves one idle, without halving the speed of the tests beside them. The suite runs it
first (``tests/conftest.py``), so the two overlap.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resurge.events import FaultDetected, JobPhase
from resurge.local.job_factory import python_job
from resurge.local.story import run_job

WORKER = str(Path(__file__).parent / "workers" / "progress_worker.py")
# How long the soak runs (see the module's docstring for why a minute).
SOAK_SECONDS = float(os.environ.get("RESURGE_SOAK_SECONDS", "60"))
STEP_SECONDS = 0.1

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(SOAK_SECONDS + 180)]


async def test_healthy_workers_on_loaded_cores_raise_no_fault(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    steps = int(SOAK_SECONDS / STEP_SECONDS)
    job = python_job(
        "soak",
        WORKER,
        *("--steps", str(steps), "--step-seconds", str(STEP_SECONDS), "--print-every", "10"),
        "--no-step-metric",
        nproc=2,
        replicas=2,
        monitoring={
            "startupTimeoutSeconds": 60,
            "heartbeatTimeoutSeconds": 10,
            "logRules": [
                {
                    "name": "steps",
                    "logPattern": r"^step (\d+)",
                    "expectedStartCutOffInSeconds": 60,
                    "expectedRecurringFrequencyInSeconds": 10,
                }
            ],
            "straggler": {"enabled": True},
        },
    )
    beside_the_suite = "PYTEST_XDIST_WORKER" in os.environ
    busy_loop = "import os, sys; os.nice(19 if sys.argv[1] == 'low' else 0)\nwhile True: pass"
    priority = "low" if beside_the_suite else "same"
    hogs = [
        subprocess.Popen([sys.executable, "-c", busy_loop, priority])  # noqa: ASYNC220 (load)
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        result = await run_job(job, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                               nodes=2, wait_seconds=SOAK_SECONDS + 120)  # fmt: skip
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    faults = [o.event for o in result.observed if isinstance(o.event, FaultDetected)]
    assert faults == []
    assert result.phase is JobPhase.SUCCEEDED
    assert result.seconds >= SOAK_SECONDS
