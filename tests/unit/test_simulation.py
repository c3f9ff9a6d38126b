"""The goodput simulator: determinism, the services' own decisions, the command line."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

import resurge.control.decisions.elastic_decision as elastic_decision
import resurge.control.decisions.recovery_policy as recovery_policy
import resurge_restarter.service as restarter_service
import resurge_scaler.resizer as scaler_resizer
from resurge.cli import main
from resurge.cluster import NodeInfo
from resurge.control.decisions.admission import start
from resurge.control.state.records import JobRecord, Placement
from resurge.events import FaultDetected, FaultScope, RecoveryLevel, Source
from resurge.simulation import ConfigError, parse_config, recovery_desk, simulate, trace_run
from resurge.simulation.recovery_desk import EPOCH, FaultInput, RecoveryDesk, at
from resurge.simulation.single_job import JobSettings, run_job

SMALL: dict[str, Any] = {
    "days": 20,
    "cluster": {"nodes": 66, "spares": 2},
    "failure_rate_scale": 10.0,
    "checkpoint": {"interval_minutes": 20, "write_seconds": 20},
}


def test_same_seed_same_result_other_seed_other_result() -> None:
    first = simulate(parse_config({**SMALL, "seed": 3})).to_json()
    again = simulate(parse_config({**SMALL, "seed": 3})).to_json()
    other = simulate(parse_config({**SMALL, "seed": 4})).to_json()
    assert first == again
    assert first != other


def test_every_policy_meets_the_same_failures_and_the_ledger_adds_up() -> None:
    summary = simulate(parse_config(SMALL))
    hours = SMALL["days"] * 24 * 64 * 8
    for result in summary.results:
        held = result.productive_gpu_hours + sum(result.lost_gpu_hours.values())
        assert held == pytest.approx(hours, rel=1e-6)
        assert result.ettr == pytest.approx(result.productive_gpu_hours / hours, abs=1e-4)
    full, torchrun, process, in_process = summary.results
    assert sum(full.faults.values()) > 20
    assert set(full.restarts) == {"job"} and set(torchrun.restarts) == {"process", "job"}
    assert "in_process" in in_process.restarts and "in_process" not in process.restarts
    assert full.lost_gpu_hours["restart"] > process.lost_gpu_hours["restart"]


def test_the_simulator_calls_the_services_own_decisions() -> None:
    for module, name, own in (
        (recovery_desk, "apply_fault", recovery_policy.apply_fault),
        (restarter_service, "apply_fault", recovery_policy.apply_fault),
        (trace_run, "plan", elastic_decision.plan),
        (scaler_resizer, "plan", elastic_decision.plan),
    ):
        assert getattr(module, name) is own, (module.__name__, name)


def test_each_decision_is_the_policy_modules_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call the simulator makes gets what the policy module returns for a copy of
    the same record and fault."""
    seen: list[tuple[str, str]] = []
    real = recovery_policy.apply_fault

    def spy(record: JobRecord, fault: FaultDetected, **kwargs: Any) -> recovery_policy.Decision:
        copy = record.model_copy(deep=True)
        expected = real(copy, fault, **kwargs)
        decision = real(record, fault, **kwargs)
        assert decision == expected and record == copy
        seen.append((decision.verdict.value, decision.level.value))
        return decision

    monkeypatch.setattr(recovery_desk, "apply_fault", spy)
    run = run_job(JobSettings.of(parse_config(SMALL), 2), keep_decisions=True)
    assert len(seen) == len(run.decisions) > 20
    assert [(o.verdict.value, (o.level or RecoveryLevel.PROCESS).value) for _, _, o in
            run.decisions] == seen  # fmt: skip


def _full_record(desk: RecoveryDesk, nodes: list[str], spares: list[str]) -> JobRecord:
    record = JobRecord(name="simulated", spec=desk.job, submitted=EPOCH, updated=EPOCH)
    recovery_policy.apply_progress_capability(record, desk.in_process_capable)
    placements = [Placement(replica=i, node=n) for i, n in enumerate(nodes)]
    start(record, placements, spares)
    return record


def test_the_projected_record_decides_as_the_full_one() -> None:
    """A scripted fault sequence: the simulator's one-placement record and the full
    record of every replica, with every node in the cluster view, get the same
    decisions (the same rung, the same moves)."""
    recovery = parse_config({"cluster": {"nodes": 6, "spares": 2}}).policies[2].recovery
    desk = RecoveryDesk("simulated", recovery, 8, in_process_capable=True)
    where = [f"node-{i}" for i in range(4)]
    spare = ["node-4", "node-5"]
    desk.start(0.0, 0, where[0], spare[:1])
    full = _full_record(desk, where, spare[:1])
    nodes = {n: NodeInfo(name=n, slots=8, heartbeat=EPOCH) for n in where + spare}
    source = Source(service="test", instance="test")

    def both(now: float, scope: FaultScope, replica: int, node: str, reason: str) -> None:
        rank = replica * 8 + 1 if scope is FaultScope.PROCESS else None
        rung = RecoveryLevel.IN_PROCESS if scope is FaultScope.PROCESS else RecoveryLevel.NODE
        fault = FaultInput(f"f{now}", reason, scope, rung, replica, node, rank, desk.generation)
        free = [nodes[n] for n in nodes if n not in where and n != node]
        ours = desk.fault(now, fault, free, where[replica])
        event = FaultDetected(
            fault_id=fault.fault_id, scope=scope, reason=reason, job="simulated",
            replica=replica, node=node, rank=rank, generation=full.generation,
            time=at(now), source=source,
        )  # fmt: skip
        live = [nodes[n] for n in nodes if n != node or scope is FaultScope.PROCESS]
        used = {n: 8 for n in where}
        theirs = recovery_policy.apply_fault(
            full, event, now=at(now), cluster=recovery_policy.ClusterView(live, used)
        )
        assert (ours.verdict, ours.level) == (theirs.verdict, theirs.level)
        plan = full.pending_recovery
        moves = (
            () if plan is None else tuple((m.replica, m.from_node, m.to_node) for m in plan.moves)
        )
        assert ours.moves == moves
        for replica_moved, _, to_node in moves:
            where[replica_moved] = to_node

    def progressed(now: float) -> None:
        desk.started(now)
        desk.stepped(now + 1)
        for record in (full,):
            recovery_policy.mark_dispatched(record, record.generation)
            step = (record.resume_step or 0) + 1
            recovery_policy.apply_sign_of_life(
                record, record.generation, at(now + 1), progress=True, step=step
            )

    both(100.0, FaultScope.PROCESS, 2, where[2], "software")  # in_process
    both(105.0, FaultScope.PROCESS, 2, where[2], "software")  # before progress: one up
    progressed(120.0)
    both(1000.0, FaultScope.NODE, 1, where[1], "gpu")  # node: onto the spare
    both(1010.0, FaultScope.NODE, 3, where[3], "host")  # during the restart: escalates
    progressed(1700.0)
    both(3000.0, FaultScope.PROCESS, 0, where[0], "network")
    assert full.restarts == desk.record.restarts


def test_cli_writes_the_plot_and_the_summary(tmp_path: Path) -> None:
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump({**SMALL, "days": 5}))
    out = tmp_path / "out"
    assert main(["simulate", str(config), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [p["policy"] for p in summary["policies"]] == [
        "full-job restart", "torchrun restart", "process restart", "in-process restart",
    ]  # fmt: skip
    assert set(summary["policies"][0]["lost_gpu_hours"]) == {
        "detection", "restart", "redone", "checkpoint", "waiting", "snapshot",
    }  # fmt: skip
    assert (out / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_names_the_bad_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"cluster": {"nodes": 8}, "checkpoint": {"interval": 5}}))
    assert main(["simulate", str(config)]) == 2
    assert "checkpoint.interval" in capsys.readouterr().err
    config.write_text(yaml.safe_dump({"cluster": {"nodes": 8}, "policies": [
        {"name": "a", "recovery": {"levels": ["job", "node"]}}]}))  # fmt: skip
    assert main(["simulate", str(config)]) == 2
    assert "policies[0].recovery.levels" in capsys.readouterr().err


def test_trace_runs_use_idle_capacity() -> None:
    config = parse_config({
        "days": 1, "cluster": {"nodes": 16}, "failure_rate_scale": 0,
        "policies": [{"name": "fixed", "elastic": False}, {"name": "elastic"}],
        "trace": [
            {"name": "a", "hours": 24, "min_replicas": 4, "max_replicas": 12},
            {"name": "b", "start_hours": 6, "hours": 6, "min_replicas": 8, "priority": 1},
        ],
    })  # fmt: skip
    fixed, elastic = simulate(config).results
    assert fixed.used_gpu_hours == pytest.approx((4 * 24 + 8 * 6) * 8, rel=0.01)
    assert elastic.used_gpu_hours is not None and fixed.used_gpu_hours is not None
    assert elastic.used_gpu_hours > fixed.used_gpu_hours
    assert elastic.idle_capacity_used is not None and 0.5 < elastic.idle_capacity_used <= 1.0
    assert elastic.resizes >= 2


def test_a_config_error_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"failures\.gpu\.scope"):
        parse_config(
            {
                "cluster": {"nodes": 4},
                "failures": {"gpu": {"per_1000_node_days": 1, "scope": "rack"}},
            }
        )
    with pytest.raises(ConfigError, match=r"cluster\.nodes"):
        parse_config({"cluster": {}})
    assert timedelta(0) == at(0.0) - EPOCH
