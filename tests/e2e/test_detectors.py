"""Detectors with real workers on the local cluster: hangs, log rules, stragglers, XIDs.

Workers are real processes (tests/e2e/workers/progress_worker.py, no torch) that report
progress through resurge.worker, or the DDP example (torch, gloo); faults are injected
with `resurge inject`'s commands.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from resurge.control.effects.client import inject_fault, inject_xid
from resurge.events import Assign, JobPhase, ProcessStateChanged, Progress, RecoveryFinished
from resurge.jobspec import TrainingJob
from resurge.jobspec.monitoring import STOPPED_RANK_SECONDS, MonitoringSpec
from resurge.local.demo import demo_job, final_step, total_steps
from resurge.local.job_factory import python_job
from resurge.local.story import Observed, Watch, run_job
from resurge.runtime.bus import Bus

WORKER = str(Path(__file__).parent / "workers" / "progress_worker.py")

pytestmark = pytest.mark.e2e


def progress_job(
    name: str, *args: str, monitoring: dict[str, Any] | None = None, replicas: int = 1
) -> TrainingJob:
    """The progress worker as ``replicas`` x 2 ranks, two retries, a short stop grace."""
    return python_job(
        name,
        WORKER,
        *args,
        nproc=2,
        replicas=replicas,
        monitoring=monitoring,
        recovery={"jobMaxRetryCount": 2, "stopGraceSeconds": 2},
    )


def progressed(generation: int, rank: int, steps: int) -> Callable[[list[Observed]], bool]:
    def test(seen: list[Observed]) -> bool:
        return any(
            isinstance(o.event, Progress) and o.event.generation == generation
            and o.event.rank == rank and o.event.step >= steps
            for o in seen
        )  # fmt: skip

    return test


async def test_a_stopped_worker_is_a_hang_detected_within_its_timeout(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    timeout = 1.0
    spec = progress_job(
        "hangs",
        *("--steps", "60"),
        monitoring={"heartbeatTimeoutSeconds": timeout, "startupTimeoutSeconds": 20},
    )

    async def stop_rank_1(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(progressed(0, 1, 10))
        await inject_fault(bus, "hangs", 1, "hang")

    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=1, wait_seconds=60, during=stop_rank_1)  # fmt: skip
    assert result.phase is JobPhase.SUCCEEDED
    [fault] = result.faults
    assert fault.reason == "hang" and fault.rank == 1 and fault.generation == 0
    last = max(o.event.time for o in result.observed if isinstance(o.event, Progress)
               and o.event.rank == 1 and o.event.generation == 0)  # fmt: skip
    waited = (fault.time - last).total_seconds()
    assert timeout < waited <= timeout + 0.5, waited
    assert len(result.events(RecoveryFinished)) == 1


async def test_a_stopped_ddp_rank_under_default_monitoring_is_blamed_in_seconds_and_trains_again(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    spec = demo_job(tmp_path)  # examples/ddp/job.yaml: 2 replicas x 2 ranks, steps of ~0.05 s
    assert spec.spec.monitoring == MonitoringSpec()  # default monitoring
    stopped_at: list[float] = []

    async def stop_rank_1(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(progressed(0, 1, 15), 120)  # past the checkpoint of step 10
        stopped_at.append(time.time())  # no later than the SIGSTOP itself
        await inject_fault(bus, spec.name, 1, "hang")  # SIGSTOP: alive, silent, no exit

    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=2, gpus_per_node=2, wait_seconds=180,
                           during=stop_rank_1)  # fmt: skip
    states = [o.event for o in result.observed if isinstance(o.event, ProcessStateChanged)]
    assert any(s.rank == 1 and s.stopped for s in states), "the agent reported no stopped rank"
    seen = [(f.reason, f.rank, f.generation, f.message) for f in result.faults]
    assert len(result.faults) == 1, seen  # the peers waiting on rank 1 are not faults of their own
    [fault] = result.faults
    assert (fault.reason, fault.rank, fault.generation) == ("hang", 1, 0), fault
    assert fault.evidence["blamed"] == "stopped"
    waited = fault.time.timestamp() - stopped_at[0]
    assert STOPPED_RANK_SECONDS <= waited <= STOPPED_RANK_SECONDS + 3, waited
    assert progressed(1, 0, 1)(result.observed)  # the next generation trains
    assert result.phase is JobPhase.SUCCEEDED
    assert final_step(result) == total_steps(spec)


async def test_log_rules_restart_alert_and_count_metric_points(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    rules = [
        {"name": "cuda", "logPattern": "CUDA error", "faultOnMatch": True},
        {"name": "nccl-warn", "logPattern": "NCCL WARN", "faultOnMatch": True,
         "action": "alert"},
        {"name": "slow-steps", "logPattern": r"step time (\d+\.\d+)", "metricThreshold": 2.5,
         "operator": "gt", "metricEvaluationDataPoints": 3},
    ]  # fmt: skip
    spec = progress_job(
        "logs", "--steps", "200", "--step-seconds", "0.02", monitoring={"logRules": rules}
    )

    async def say(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(progressed(0, 0, 5))
        for line in ["NCCL WARN net timeout", "step time 3.0", "step time 2.0", "step time 3.1",
                     "step time 3.2", "step time 3.3"]:  # fmt: skip
            await inject_fault(bus, "logs", 0, "log", line)
        await watch.wait_for(progressed(1, 1, 3))  # the metric rule restarted the job
        await inject_fault(bus, "logs", 1, "log", "RuntimeError: CUDA error: misaligned address")

    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=1, wait_seconds=90, during=say)  # fmt: skip
    by_rule = {f.evidence.get("rule"): f for f in result.faults}
    assert by_rule["nccl-warn"].alert_only
    metric = by_rule["slow-steps"]
    assert metric.reason == "log_metric" and "3.3" in str(metric.evidence)
    assert by_rule["cuda"].rank == 1 and not by_rule["cuda"].alert_only
    assert (metric.generation, by_rule["cuda"].generation) == (0, 1)
    assert len(result.events(RecoveryFinished)) == 2  # metric, then CUDA; never the alert
    assert result.phase is JobPhase.SUCCEEDED


async def test_a_slow_rank_is_reported_with_its_evidence(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    straggler = {"enabled": True, "windowSteps": 5, "slowFactor": 1.5, "minSteps": 3,
                 "consecutiveWindows": 2}  # fmt: skip
    spec = progress_job(
        "slow",
        *("--steps", "40", "--step-seconds", "0.03", "--slow-rank", "2", "--slow-factor", "3"),
        replicas=2,
        monitoring={"straggler": straggler},
    )
    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=2, wait_seconds=60)  # fmt: skip
    [fault] = result.faults
    assert fault.reason == "straggler" and fault.rank == 2 and fault.scope.value == "node"
    assert fault.alert_only  # the default action
    assert float(str(fault.evidence["rank_mean_seconds"])) > 1.5 * float(
        str(fault.evidence["median_seconds"])
    )
    assert result.phase is JobPhase.SUCCEEDED and not result.events(RecoveryFinished)


async def test_an_injected_fatal_xid_is_a_node_scoped_fault_and_recovered(
    nats_url: str, namespace: str, tmp_path: Path
) -> None:
    spec = progress_job("xid", "--steps", "80", "--step-seconds", "0.03")
    placed: list[str] = []

    async def break_gpu(bus: Bus, watch: Watch) -> None:
        await watch.wait_for(progressed(0, 0, 5))
        (first,) = [o.event for o in watch.observed if isinstance(o.event, Assign)]
        placed.append(str(first.node))
        await inject_xid(bus, placed[0], 0, 79)

    result = await run_job(spec, state_dir=tmp_path, nats_url=nats_url, namespace=namespace,
                           nodes=2, wait_seconds=60, during=break_gpu)  # fmt: skip
    bad, good = placed[0], ({"node-0", "node-1"} - set(placed)).pop()
    by_reason = {f.reason: f for f in result.faults}
    # The GPU's fault always; the node's own (unhealthy) only if the node-health detector
    # judges it while the job still runs there: once the replica has moved, a node fault
    # about a node the job left is no fault of the job's.
    assert "gpu_xid" in by_reason and set(by_reason) <= {"gpu_xid", "node_unhealthy"}
    assert all(f.scope.value == "node" and f.node == bad for f in result.faults)
    fault = by_reason["gpu_xid"]
    assert fault.evidence["xid"] == 79 and fault.evidence["action"] == "replace_node"
    assert fault.suggested_level is not None and fault.suggested_level.value == "node"
    # one recovery, at node level: the replica moved to the other node; the second fault is of
    # the generation the first one already ended.
    (recovered,) = result.events(RecoveryFinished)
    assert recovered.level.value == "node"
    moved = [a for a in result.events(Assign) if a.generation == 1]
    assert [a.node for a in moved] == [good]
    assert result.phase is JobPhase.SUCCEEDED
