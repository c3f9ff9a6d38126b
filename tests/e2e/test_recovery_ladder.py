"""The recovery ladder end to end: real torch (gloo) workers on the local cluster.

Every part is a real process: nats-server, detector, restarter(s), scaler, one monitor
per virtual node, one launch agent per replica, torch workers forked from the fork
server. Faults are real (a rank that exits 1, an injected XID on a simulated GPU, a
restarter killed with SIGKILL) except in the two-restarter test, which publishes a
burst of faults itself, as several detectors reporting one incident would.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from resurge.cluster import open_backend
from resurge.control.effects.client import inject_fault, inject_xid
from resurge.control.state.records import JobStore, status_view
from resurge.events import (
    AgentStateChanged,
    Assign,
    FaultDetected,
    FaultScope,
    JobPhase,
    PhaseChanged,
    ProcessExited,
    ProcessStarted,
    Progress,
    RecoveryLevel,
    RecoveryStarted,
)
from resurge.jobspec import TrainingJob
from resurge.local.demo import KILL_AFTER_STEP, demo_job, final_step, steps_lost, total_steps
from resurge.local.job_factory import python_job
from resurge.local.story import Observed, StoryResult, Watch, run_job
from resurge.runtime.bus import Bus
from resurge.runtime.settings import Settings

WORKER = str(Path(__file__).parent / "workers" / "torch_worker.py")

pytestmark = pytest.mark.e2e


def torch_job(
    name: str,
    *args: str,
    nproc: int = 2,
    monitoring: dict[str, Any] | None = None,
    **recovery: Any,
) -> TrainingJob:
    """The torch worker as 2 replicas x ``nproc`` ranks; ``recovery`` adds to a 2 s stop grace."""
    return python_job(
        name,
        WORKER,
        *args,
        nproc=nproc,
        replicas=2,
        preload=["torch", "torch.distributed"],
        env={"OMP_NUM_THREADS": "1"},
        recovery={"stopGraceSeconds": 2, **recovery},
        monitoring=monitoring,
    )


def progressed(generation: int, step: int = 3) -> Callable[[list[Observed]], bool]:
    def test(seen: list[Observed]) -> bool:
        return any(
            isinstance(o.event, Progress) and o.event.generation == generation
            and o.event.step >= step
            for o in seen
        )  # fmt: skip

    return test


async def final_status(nats_url: str, namespace: str, name: str) -> dict[str, Any]:
    bus = await Bus.connect(Settings(nats_url=nats_url, namespace=namespace), "test")
    try:
        found = await JobStore(await bus.jobs_bucket()).get(name)
        assert found is not None
        return status_view(found[0])
    finally:
        await bus.close()


def recoveries(result: StoryResult) -> dict[int, RecoveryStarted]:
    """RecoveryStarted by the generation it starts (one each, whoever published it)."""
    return {e.to_generation: e for e in result.events(RecoveryStarted)}


def agent_instances(result: StoryResult, generation: int) -> dict[int, set[str]]:
    """Replica -> the agent processes that reported running ``generation``."""
    seen: dict[int, set[str]] = {}
    for e in result.events(AgentStateChanged):
        if e.generation == generation and e.replica is not None:
            seen.setdefault(e.replica, set()).add(e.source.instance)
    return seen


async def test_a_rank_that_crashes_every_time_climbs_process_pod_job_then_fails(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    spec = torch_job(
        "ladder", "--steps", "400", "--crash-rank", "1", "--crash-at-step", "4",
        jobMaxRetryCount=10, maxFullJobRestarts=1,
        backoff={"initialSeconds": 0.2, "maxSeconds": 1},
    )  # fmt: skip
    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=2, wait_seconds=150)  # fmt: skip

    assert result.phase is JobPhase.FAILED
    started = recoveries(result)
    assert [started[g].level for g in sorted(started)] == [
        RecoveryLevel.PROCESS, RecoveryLevel.POD, RecoveryLevel.JOB,
    ]  # fmt: skip
    assert all(started[g].reason == "process_crash" for g in started)
    # process: same agents; pod: replica 0 (rank 1's) recreated; job: both recreated
    agents = [agent_instances(result, g) for g in range(4)]
    assert agents[1] == agents[0]
    assert agents[2][0].isdisjoint(agents[1][0]) and agents[2][1] == agents[1][1]
    assert agents[3][0].isdisjoint(agents[2][0]) and agents[3][1].isdisjoint(agents[2][1])

    failed = [e for e in result.events(PhaseChanged) if e.phase is JobPhase.FAILED]
    assert len(failed) == 1
    assert "process_crash" in failed[0].message
    assert "maxFullJobRestarts=1 spent" in failed[0].message
    status = await final_status(nats_url, namespace, "ladder")
    assert status["phase"] == "Failed" and status["generation"] == 3
    assert status["restarts"] == {"process": 1, "pod": 1, "job": 1}
    assert status["message"] == failed[0].message


async def test_a_fatal_xid_moves_the_replica_off_its_node_to_the_spare(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    spec = torch_job("spare", "--steps", "120", "--step-seconds", "0.03", spares=1)
    placed: dict[str, str] = {}

    async def break_gpu(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(progressed(0))
        first = [o.event for o in watch.observed if isinstance(o.event, Assign)]
        placed.update({f"replica-{a.replica}": str(a.node) for a in first})
        await inject_xid(bus, placed["replica-0"], 0, 79)
        await watch.wait_for(progressed(1))
        backend = await open_backend(bus, bus.settings)
        nodes = {n.name: n for n in await backend.list_nodes()}
        placed["cordoned"] = ",".join(sorted(n for n, info in nodes.items() if info.cordoned))

    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=3, wait_seconds=90, during=break_gpu)  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    bad = placed["replica-0"]
    spare = ({"node-0", "node-1", "node-2"} - {bad, placed["replica-1"]}).pop()
    started = recoveries(result)
    assert list(started) == [1] and started[1].level is RecoveryLevel.NODE
    assigns = {(a.generation, a.replica): a.node for a in result.events(Assign)}
    assert assigns[(1, 0)] == spare and assigns[(1, 1)] == placed["replica-1"]
    assert placed["cordoned"] == bad
    status = await final_status(nats_url, namespace, "spare")
    assert status["restarts"] == {"node": 1}
    assert status["avoidNodes"] == [bad] and status["spareNodes"] == []


async def test_a_restarter_killed_mid_recovery_still_makes_exactly_one_new_generation(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    # The second restart waits out a 4 s backoff; the restarter is SIGKILLed inside it,
    # after the decision is written and Stop(1) went out, before Assign(2).
    spec = torch_job(
        "crashsafe", "--steps", "150", "--step-seconds", "0.03", nproc=1,
        backoff={"initialSeconds": 4}, monitoring={"heartbeatTimeoutSeconds": 1},
    )  # fmt: skip
    killed: list[int] = []

    async def kill_mid_recovery(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(progressed(0))
        await inject_fault(bus, "crashsafe", 1, "crash")
        await watch.wait_for(progressed(1))
        await inject_fault(bus, "crashsafe", 0, "hang")  # another reason: process level again

        def deciding(seen: list[Observed]) -> bool:
            return any(isinstance(o.event, RecoveryStarted) and o.event.to_generation == 2
                       for o in seen)  # fmt: skip

        await watch.wait_for(deciding, 30)
        assert watch.supervisor is not None
        process = watch.supervisor.children["restarter"].process
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        killed.append(process.pid)

    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=2, wait_seconds=120, during=kill_mid_recovery)  # fmt: skip

    assert killed and result.service_restarts["restarter"] == 1
    assert result.phase is JobPhase.SUCCEEDED
    started = recoveries(result)
    assert sorted(started) == [1, 2]
    assert started[2].level is RecoveryLevel.PROCESS
    generations = sorted({a.generation for a in result.events(Assign)})
    assert generations == [0, 1, 2]
    # generation 2's Assigns were sent once, by the restarter that took over
    replicas_of_2 = [a.replica for a in result.events(Assign) if a.generation == 2]
    assert len(replicas_of_2) == 2 and set(replicas_of_2) == {0, 1}
    status = await final_status(nats_url, namespace, "crashsafe")
    assert status["generation"] == 2 and status["restarts"] == {"process": 2}


async def test_two_restarters_side_by_side_act_once_on_a_burst_of_faults(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    spec = torch_job("twins", "--steps", "150", "--step-seconds", "0.03", nproc=1)
    burst = 24

    async def report_one_incident_many_times(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(progressed(0))
        faults = [
            FaultDetected(
                source=bus.source, job="twins", generation=0, rank=i % 2, replica=i % 2,
                fault_id=f"incident-{i}", scope=FaultScope.PROCESS, reason="process_crash",
                suggested_level=RecoveryLevel.PROCESS,
            )
            for i in range(burst)
        ]  # fmt: skip
        await asyncio.gather(
            *(bus.publish(bus.subjects.fault("twins", "process"), f) for f in faults)
        )

    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=2, wait_seconds=90, during=report_one_incident_many_times,
                           restarters=2)  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert result.service_restarts == {name: 0 for name in result.service_restarts}
    started = [e for e in result.events(RecoveryStarted)]
    assert len(started) == 1 and started[0].to_generation == 1
    assert sorted((a.generation, a.replica) for a in result.events(Assign)) == [
        (0, 0), (0, 1), (1, 0), (1, 1),
    ]  # fmt: skip
    logs = [(tmp_path / "logs" / f"{name}.log").read_text() for name in
            ("restarter", "restarter-2")]  # fmt: skip
    # Both read the burst from one durable consumer; which takes how many is the
    # server's choice (under load one pull can take all 24), so only the total is known.
    handled = [log.count("incident-") for log in logs]
    assert sum(handled) >= 1, f"no restarter logged an incident: {handled}"
    status = await final_status(nats_url, namespace, "twins")
    assert status["generation"] == 1 and status["restarts"] == {"process": 1}


async def test_an_exception_in_one_rank_is_recovered_in_process_with_no_pid_changed(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    example = demo_job(tmp_path)
    steps = total_steps(example)

    async def raise_in_rank_1(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(progressed(0, KILL_AFTER_STEP), 120)
        await inject_fault(bus, example.name, 1, "exception")

    result = await run_job(example, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=2, wait_seconds=150, during=raise_in_rank_1)  # fmt: skip

    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == steps
    faults = result.faults
    assert faults and faults[0].reason == "worker_exception" and faults[0].rank == 1
    started = recoveries(result)
    assert list(started) == [1] and started[1].level is RecoveryLevel.IN_PROCESS
    (finished,) = result.recoveries
    assert finished.level is RecoveryLevel.IN_PROCESS and finished.duration_seconds > 0
    starts = result.events(ProcessStarted)
    pids = {(e.rank, e.pid) for e in starts if e.generation == 0 and not e.in_process}
    rejoined = {(e.rank, e.pid) for e in starts if e.generation == 1 and e.in_process}
    assert len(pids) == 4 and rejoined == pids and len(starts) == 8
    exited = {(e.rank, e.pid) for e in result.events(ProcessExited)}
    assert exited == pids  # the same four processes trained both generations, then exited
    assert {e.generation for e in result.events(ProcessExited)} == {1}
    assert {e.generation for e in result.events(Progress)} == {0, 1}
    [lost] = steps_lost(result)
    every = int(example.spec.command[example.spec.command.index("--checkpoint-every") + 1])
    assert 0 <= lost <= every
