"""The first detect-and-restart loop, end to end, every part a real process.

nats-server, detector, restarter, scaler and one node agent per replica run as
processes; workers are real processes that crash on purpose.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from resurge.contract.subjects import Subjects
from resurge.events import (
    AgentState,
    Assign,
    FaultDetected,
    JobPhase,
    PhaseChanged,
    RecoveryFinished,
    RecoveryStarted,
    ReplicaFinished,
    Stop,
)
from resurge.jobspec import load_job
from resurge.local.job_factory import python_job
from resurge.local.story import run_job

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


async def test_crash_once_example_finishes_after_exactly_one_restart(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = load_job(REPO / "examples" / "crash_once" / "job.yaml")
    result = await run_job(
        job,
        state_dir=tmp_path,
        nats_url=nats_url,
        namespace=namespace,
        nodes=2,
        gpus_per_node=2,
        cwd=REPO,
        wait_seconds=60,
    )
    subjects = Subjects(namespace)

    assert result.phase is JobPhase.SUCCEEDED
    faults = [o for o in result.observed if isinstance(o.event, FaultDetected)]
    assert len(faults) == 1
    assert faults[0].subject == subjects.fault("crash-once", "process")
    assert faults[0].event.rank == 0 and faults[0].event.generation == 0

    actions = [o for o in result.observed if o.subject == subjects.action("crash-once")]
    started = [o.event for o in actions if isinstance(o.event, RecoveryStarted)]
    finished = [o.event for o in actions if isinstance(o.event, RecoveryFinished)]
    assert len(started) == 1 and len(finished) == 1
    assert started[0].from_generation == 0 and started[0].to_generation == 1
    assert finished[0].duration_seconds > 0
    phases = [o.event.phase for o in actions if isinstance(o.event, PhaseChanged)]
    assert phases == [
        JobPhase.PENDING,
        JobPhase.RUNNING,
        JobPhase.RECOVERING,
        JobPhase.RUNNING,
        JobPhase.SUCCEEDED,
    ]

    commands = [o for o in result.observed if o.subject.startswith(f"{subjects.root}.cmd.")]
    assigns = sorted(
        (o.event.generation, o.event.replica) for o in commands if isinstance(o.event, Assign)
    )
    assert assigns == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(o.subject == subjects.cmd("crash-once", o.event.replica) for o in commands)
    # Nothing happens between stopping generation 0 and starting 1: each replica's Stop
    # is folded into its Assign, no Stop goes on its own.
    assert [o for o in commands if isinstance(o.event, Stop) and not o.event.final] == []
    folded = [
        (o.event.replica, o.event.stop.generation)
        for o in commands
        if isinstance(o.event, Assign) and o.event.generation == 1 and o.event.stop is not None
    ]
    assert sorted(folded) == [(0, 0), (1, 0)]

    done = [o for o in result.observed if isinstance(o.event, ReplicaFinished)]
    # replica 1's workers may also finish generation 0 before rank 0's crash stops it
    assert Counter(o.event.replica for o in done if o.event.generation == 1) == Counter([0, 1])
    assert {o.subject for o in done} == {subjects.job("crash-once")}
    assert result.final_agent_states() == {0: AgentState.EXITING, 1: AgentState.EXITING}
    assert len(result.restart_latencies()) == 1


async def test_restart_limit_spent_fails_the_job_and_says_why(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    job = python_job(
        "always-fails",
        "-c",
        "import sys; sys.exit(3)",
        recovery={"jobMaxRetryCount": 1, "stopGraceSeconds": 2},
        preload=None,
    )
    result = await run_job(
        job,
        state_dir=tmp_path,
        nats_url=nats_url,
        namespace=namespace,
        nodes=1,
        gpus_per_node=1,
        wait_seconds=60,
    )
    assert result.phase is JobPhase.FAILED
    assert len([e for e in result.faults]) == 2
    assert len([o for o in result.observed if isinstance(o.event, RecoveryStarted)]) == 1
    [failed] = [
        o.event
        for o in result.observed
        if isinstance(o.event, PhaseChanged) and o.event.phase is JobPhase.FAILED
    ]
    assert "jobMaxRetryCount=1" in failed.message and "process_crash" in failed.message
    assert result.final_agent_states() == {0: AgentState.EXITING}
