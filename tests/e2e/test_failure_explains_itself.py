"""A job that cannot start says why in the failing rank's own words: `python
nosuch_train.py` crash-loops, climbs the ladder, fails, and `resurge status` and
`resurge events` quote what Python printed. Its generations never trained, so none of
them counts as recovered, and its goodput is 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resurge.events import JobPhase, RecoveryLevel, RecoveryStarted
from resurge.local.job_factory import job
from resurge.local.story import run_job

JOB = "no-such-script"
CAUSE = "can't open file"

pytestmark = pytest.mark.e2e


def resurge(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "resurge.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


async def test_a_job_whose_script_is_missing_fails_quoting_pythons_own_words(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    spec = job(
        JOB,
        ["python", "nosuch_train.py"],
        nproc=2,
        replicas=1,
        recovery={"backoff": {"initialSeconds": 0.2, "maxSeconds": 1}},
    )
    result = await run_job(
        spec,
        state_dir=tmp_path / "state",
        nats_url=nats_url,
        namespace=namespace,
        nodes=1,
        gpus_per_node=2,
        wait_seconds=240,
        cwd=tmp_path,
    )
    assert result.phase is JobPhase.FAILED
    assert result.recoveries == []  # no generation trained: none recovered
    levels = [e.level for e in result.events(RecoveryStarted)]
    assert levels[:2] == [RecoveryLevel.PROCESS, RecoveryLevel.POD], levels  # it climbed
    crashes = [f for f in result.faults if f.reason == "process_crash"]
    assert crashes and all(CAUSE in str(f.evidence.get("last_output")) for f in crashes)
    assert all(CAUSE in f.message for f in crashes)

    env = {"RESURGE_NATS_URL": nats_url, "RESURGE_NAMESPACE": namespace}
    status = resurge(env, "status", JOB, "--json")
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    assert view["phase"] == JobPhase.FAILED.value
    assert CAUSE in view["message"] and "ended before the rendezvous" in view["message"]
    assert view["goodput"] == 0.0  # it never trained

    events = resurge(env, "events", "--job", JOB)
    assert events.returncode == 0, events.stderr
    exits = [line for line in events.stdout.splitlines() if "exited 2" in line]
    assert exits and all(CAUSE in line for line in exits)
    as_json = resurge(env, "events", "--job", JOB, "--json")
    stored = [json.loads(line) for line in as_json.stdout.splitlines()]
    last = [e["last_output"] for e in stored if e["kind"] == "process_exited" and not e["expected"]]
    assert last and all(any(CAUSE in line for line in lines) for lines in last)
